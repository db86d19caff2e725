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


def test_check_exits_2_with_the_file_and_line_of_a_refused_flag(tmp_path, monkeypatch):
    """A flag vLLM refuses is a profile error (exit 2, FILE:LINE: FIELD), not an incompatible machine (4)."""
    from pathlib import Path

    from click.testing import CliRunner

    from launcher.cli import cli

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "profiles" / "tiny-cpu.yaml").read_text().replace("enforce-eager: true", "enforce-eager: maybe-yes")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "enforce-eager" in l)
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path / "state"))
    res = CliRunner().invoke(cli, ["check", str(bad), "--json"], catch_exceptions=False)
    assert res.exit_code == 2, res.output
    assert f"error: {bad}:{line}: vllm_args.enforce-eager: " in res.output and "fix: enforce-eager: true" in res.output
