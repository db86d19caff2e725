"""`radiance check` reads vllm_args with vLLM's own parser (real vLLM, in a subprocess)."""
from launcher import preflight


def test_vllm_parser_judges_each_flag():
    found = preflight.vllm_args_problems({
        "enforce-eager": "maybe-yes",          # an on/off flag given a word: would become the model
        "max-num-seqs": "many",                # not an int
        "no-such-flag": 1,                     # not a vLLM flag
        "enforce-eagre": True,                 # a typo of one
        "gpu-memory-utilization": 0.8,         # fine
        "enable-chunked-prefill": True,        # fine
        "disable-log-stats": None,             # left out
    })
    assert len(found) == 4, found
    assert found[0].startswith("vllm_args.enforce-eager: ") and "fix: enforce-eager: true" in found[0]
    assert found[1].startswith("vllm_args.max-num-seqs: ") and "invalid int value" in found[1]
    assert found[2].startswith("vllm_args.no-such-flag: ") and "not one of vLLM's flags" in found[2]
    assert found[3].startswith("vllm_args.enforce-eagre: ") and "fix: did you mean enforce-eager?" in found[3]


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


def test_a_verdict_is_kept_per_flags_and_vllm_install(tmp_path, monkeypatch):
    """The second check of the same flags reads the kept verdict instead of importing vLLM again (the
    parser's runs are counted, not faked: the verdict is real vLLM's); other flags or another vLLM get
    another key, and a torn file is checked again."""
    import subprocess

    monkeypatch.setenv("RADIANCE_CACHE_DIR", str(tmp_path / "cache"))
    runs = []
    real_run = subprocess.run

    def counting_run(cmd, *a, **kw):
        if "launcher.vllm_argcheck" in cmd:
            runs.append(cmd[-1])
        return real_run(cmd, *a, **kw)

    monkeypatch.setattr(preflight.subprocess, "run", counting_run)
    bad = {"max-num-seqs": "many"}
    first = preflight.vllm_args_problems(bad)
    assert len(first) == 1 and "invalid int value" in first[0]
    assert preflight.vllm_args_problems(bad) == first and len(runs) == 1
    key = preflight._argcheck_key(bad)
    assert preflight._argcheck_key({"max-num-seqs": 8}) != key
    ident = preflight._vllm_identity()
    assert ident and ident["versions"]
    monkeypatch.setattr(preflight, "_vllm_identity", lambda: {**ident, "versions": {"vllm": "0.33.0"}})
    assert preflight._argcheck_key(bad) != key
    monkeypatch.setattr(preflight, "_vllm_identity", lambda: ident)
    (tmp_path / "cache" / "vllm-argcheck" / f"{key}.json").write_text("{")
    assert preflight.vllm_args_problems(bad) == first and len(runs) == 2
