"""`radiance check` reads vllm_args with vLLM's own parser (real vLLM, in a subprocess)."""
from launcher import preflight


def test_vllm_parser_judges_each_flag():
    found = preflight.vllm_args_problems({
        "enforce-eager": "maybe-yes",          # an on/off flag given a word: would become the model
        "max-num-seqs": "many",                # not an int
        "no-such-flag": 1,                     # not a vLLM flag
        "gpu-memory-utilization": 0.8,         # fine
        "enable-chunked-prefill": True,        # fine
        "disable-log-stats": None,             # left out
    })
    assert len(found) == 3, found
    assert found[0].startswith("vllm_args.enforce-eager: ") and "fix: enforce-eager: true" in found[0]
    assert found[1].startswith("vllm_args.max-num-seqs: ") and "invalid int value" in found[1]
    assert found[2].startswith("vllm_args.no-such-flag: ") and "unrecognized" in found[2]
