"""Real vLLM (CPU) loads the generated tiny Qwen3-Next and decodes with its MTP layer."""

from __future__ import annotations

import pytest

from tools import tinymodel

pytestmark = pytest.mark.e2e

NUM_SPEC = 2


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from vllm import LLM

    model = tinymodel.ensure(tmp_path_factory.mktemp("tinycache"), seed=0)
    engine = LLM(
        model=str(model),
        dtype="bfloat16",  # vLLM's CPU GDN kernels reject anything else
        speculative_config={"method": "mtp", "num_speculative_tokens": NUM_SPEC},
        enable_prefix_caching=False,  # MTP on CPU fails with it on
        max_model_len=512,
        max_num_seqs=4,
        # An explicit KV size skips the memory-fraction probe, which fails on small or busy hosts,
        # and, with eager mode, the compile warm-up that dominates start-up on two cores.
        kv_cache_memory_bytes=256 << 20,
        enforce_eager=True,
        disable_log_stats=False,
        seed=0,
    )
    yield engine
    del engine


def _counter(llm, name: str) -> float:
    for metric in llm.get_metrics():
        if metric.name == name:
            return metric.value
    raise AssertionError(f"{name} not in vLLM metrics")


def test_generates_greedily_with_mtp_drafts(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = ["def add(a, b):\n    return", "Natalia sold clips to 48 of her friends"]
    outs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [24, 24]
    assert all(o.outputs[0].text for o in outs)

    drafts = _counter(llm, "vllm:spec_decode_num_drafts")
    assert drafts > 0, "MTP speculative decoding did not run"
    assert _counter(llm, "vllm:spec_decode_num_draft_tokens") == NUM_SPEC * drafts

    # Greedy decoding is reproducible within one engine.
    again = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]


def test_chat_template_is_applied(llm):
    from vllm import SamplingParams

    out = llm.chat(
        [{"role": "user", "content": "How many clips?"}],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    )
    prompt_ids = out[0].prompt_token_ids
    tok = llm.get_tokenizer()
    assert prompt_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert len(out[0].outputs[0].token_ids) == 8


# ---- the committed trained model: its MTP layer must mean something --------------------------------

CODE_PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "x1 = values[1]\nx2 = values[2]\nx3 = values[3]\nx4 = values[4]\n",
    '{"users": [{"id": 1, "name": "alice", "email": "alice.1@example.com", "active": true},',
]
PROSE_PROMPTS = [
    "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts",
    "Josh decides to try flipping a house. He buys a house for $80,000 and then puts in",
    "James decides to run 3 sprints 3 times a week. He runs 60 meters each sprint. How",
]


def test_trained_model_accepts_more_on_code_than_prose():
    """One engine on the trained model: MTP acceptance is high on code/JSON, lower on prose."""
    from vllm import LLM, SamplingParams

    model = tinymodel.trained_model_dir()
    if model is None:
        pytest.skip("models/tiny-qwen3next-trained is not in this checkout")
    engine = LLM(model=str(model), dtype="bfloat16",
                 speculative_config={"method": "mtp", "num_speculative_tokens": NUM_SPEC},
                 enable_prefix_caching=False, max_model_len=512, max_num_seqs=4,
                 kv_cache_memory_bytes=256 << 20, enforce_eager=True, disable_log_stats=False, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)

    def acceptance(prompts) -> float:
        before = (_counter(engine, "vllm:spec_decode_num_accepted_tokens"),
                  _counter(engine, "vllm:spec_decode_num_draft_tokens"))
        engine.generate(prompts, params, use_tqdm=False)
        accepted = _counter(engine, "vllm:spec_decode_num_accepted_tokens") - before[0]
        drafted = _counter(engine, "vllm:spec_decode_num_draft_tokens") - before[1]
        assert drafted > 0
        return accepted / drafted

    code, prose = acceptance(CODE_PROMPTS), acceptance(PROSE_PROMPTS)
    # Measured 2026-11-29 (k=2, 8 prompts each): code 0.86, JSON 0.72, prose 0.39.
    assert code >= 0.5, code
    assert code > prose, (code, prose)
