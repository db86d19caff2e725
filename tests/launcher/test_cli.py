"""The CLI as a user meets it: exit codes, one-line errors, JSON that parses."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner(isolated_home):
    return CliRunner()


def invoke(runner, *args, env=None):
    return runner.invoke(cli, list(args), catch_exceptions=False, env=env)


@pytest.mark.parametrize("body,field", [
    ("name: x\nmodel:\n  path: builtin:tiny-qwen3next\ncolour: 1\n", "colour"),
    ("name: x\nmodel:\n  path: builtin:tiny-qwen3next\nparallel:\n  tp: 0\n", "parallel.tp"),
    ("name: x\nmodel:\n  path: builtin:tiny-qwen3next\nparallel:\n  tp: [1]\n", "parallel.tp"),
    ("name: x\nmodel:\n  path: builtin:tiny-qwen3next\nfeatures:\n  dynamic_draft: true\n", "features.dynamic_draft"),
    ("name: x\nmodel: {path: [\n", "(yaml)"),
])
@pytest.mark.parametrize("sub", ["check", "up", "gate"])
def test_malformed_profile_exits_2_with_one_line(runner, tmp_path, body, field, sub):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    args = [sub, str(p)] + (["--url", "http://127.0.0.1:9"] if sub == "gate" else [])
    res = invoke(runner, *args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith(f"error: {p}:") and field in lines[0] and "Traceback" not in res.output


def test_bad_knob_exits_2(runner):
    res = invoke(runner, "check", str(REPO / "profiles/tiny-cpu.yaml"), env={"RADIANCE_DRAFT_TAU": "x"})
    assert res.exit_code == 2 and "RADIANCE_DRAFT_TAU" in res.output and "fix:" in res.output


def test_check_tp2_profile_on_cpu_is_incompatible_json(runner):
    res = invoke(runner, "check", str(REPO / "profiles/qwen3next-tp2.yaml"), "--json")
    assert res.exit_code == 4
    data = json.loads(res.stdout)
    assert data["compatible"] is False and data["reasons"]
    assert any("rocm" in r or "GPU" in r for r in data["reasons"])
    # No AMD GPU here: the rocm image's arch, and the arch table's defaults for it, each with its source.
    assert data["arch"] == "gfx1201"
    assert {d["name"]: d["source"] for d in data["arch_defaults"]} == {
        "NCCL_PROTO": "vLLM issue 40980 (root cause ROCm/rocm-systems issue 5480)",
        "disable-custom-all-reduce": "ROCm/vllm issue 287",
        "VLLM_ROCM_USE_AITER": "ROCm/TransformerEngine issue 520"}
    rows = [f for f in data["findings"] if f["check"] == "gfx1201 default"]
    assert len(rows) == 3 and all("source:" in f["detail"] for f in rows)


def test_check_tiny_profile_is_compatible_json(runner):
    res = invoke(runner, "check", str(REPO / "profiles/tiny-cpu.yaml"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["compatible"] is True and data["capabilities"]["vllm_supported"] is True
    assert "dynamic_draft" in data["capabilities"]["features"]


def test_status_empty_and_unknown_name(runner):
    res = invoke(runner, "status", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout) == []
    res = invoke(runner, "status", "nope")
    assert res.exit_code == 2 and "no deployment named 'nope'" in res.output


def test_help_lists_exit_codes(runner):
    res = invoke(runner, "--help")
    assert res.exit_code == 0 and "4 hardware incompatible" in res.output


def test_gate_unreachable_endpoint_exits_5(runner, tmp_path):
    res = invoke(runner, "gate", str(REPO / "profiles/tiny-cpu.yaml"), "--url", "http://127.0.0.1:9",
                 "--reports-dir", str(tmp_path))
    assert res.exit_code == 5, res.output
