"""The target check against fake endpoints: record a reference, then judge a healthy, a worse-scoring and a
diverging endpoint by it; where the reference is looked for; what a reference that does not fit says;
`radiance gate --record-reference` through the CLI. Real vLLM: tests/e2e/test_gate_e2e.py."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from launcher.cli import cli
from launcher.gate import GateConfig, run_gate, target
from launcher.gate.client import Client
from launcher.gate.config import REFERENCES_DIR, TargetConfig
from launcher.profile import load_profile

from test_gate_runner_fake_endpoint import MODEL, FakeOpenAI  # its directory is on sys.path (rootdir-less tests)

REPO = Path(__file__).resolve().parents[3]
IDENT = {"model": "fake/ckpt", "dtype": "bfloat16", "quantization": None, "tp": 1}
STRICT = {"max_nll_increase": 0.05, "min_prefix_agreement": 0.9, "min_full_agreement": 0.75}


def _record(url: str, cfg: TargetConfig, path: Path, ident: dict = IDENT) -> dict:
    async def go():
        async with Client(url, api_key=None, timeout_s=10, retries=0, concurrency=1) as client:
            return await target.record(client, cfg, model=MODEL, ident=ident, profile="fake", source="test")

    doc = asyncio.run(go())
    target.write_reference(doc, path)
    return doc


def _gate(url: str, ref: Path | None, ident: dict | None = IDENT, **target_cfg):
    cfg = GateConfig.model_validate({"target": target_cfg, "acceptance": {"enabled": False}})
    return run_gate(cfg, url, model=MODEL, progress=False, reference=ref, identity=ident,
                    context={"profile": "fake"})


@pytest.fixture()
def reference(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path / "state"))
    path = tmp_path / "ref.json"
    with FakeOpenAI() as url:
        doc = _record(url, TargetConfig(), path)
    assert doc["held_text"]["mean_nll"] == pytest.approx(1.5)
    assert len(doc["greedy"]["outputs"]) == 16 and all(len(o["token_ids"]) == 32 for o in doc["greedy"]["outputs"])
    return path


def test_the_stock_endpoint_passes_its_own_reference(reference):
    with FakeOpenAI() as url:
        report = _gate(url, reference, **STRICT)
    t = report.check("target")
    assert t.status == "pass", t.reason
    assert t.metrics["nll_increase"] == pytest.approx(0.0)
    assert t.metrics["prefix_agreement"] == 1.0 and t.metrics["prompts_identical"] == 16
    assert [c.name for c in report.checks] == ["smoke", "target", "speed", "acceptance", "gsm8k"]


def test_a_worse_log_likelihood_fails_with_one_line(reference):
    with FakeOpenAI(nll=1.7) as url:
        report = _gate(url, reference, **STRICT)
    t = report.check("target")
    assert t.status == "fail"
    assert report.reason == "target fail: mean NLL +0.2000 nats/token against stock (allowed +0.05)"
    assert "\n" not in report.reason


def test_diverging_greedy_outputs_fail_on_prefix_and_full_agreement(reference):
    with FakeOpenAI(diverge_at=8, diverge_prompts=8) as url:
        report = _gate(url, reference, **STRICT)
    t = report.check("target")
    # 8 prompts agree for 8 of 32 tokens, 8 to the end: (8 * 8 + 8 * 32) / (16 * 32)
    assert t.metrics["prefix_agreement"] == pytest.approx(0.625)
    assert [p["prefix_tokens"] for p in t.metrics["per_prompt"]] == [8] * 8 + [32] * 8
    assert t.status == "fail" and t.reason == ("greedy prefix agreement with stock 0.625 < 0.9; 8/16 prompts "
                                               "identical to stock (0.500 < 0.75)")
    # the same run under thresholds it meets
    with FakeOpenAI(diverge_at=8, diverge_prompts=8) as url:
        report = _gate(url, reference, max_nll_increase=0.05, min_prefix_agreement=0.6, min_full_agreement=0.5)
    assert report.check("target").status == "pass"


def test_without_thresholds_the_check_reports_and_passes(reference):
    with FakeOpenAI(nll=3.0, diverge_at=0) as url:
        report = _gate(url, reference)
    t = report.check("target")
    assert t.status == "pass" and "informational" in t.reason and t.metrics["prefix_agreement"] == 0.0


def test_no_reference_is_an_error_that_says_how_to_record_one(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path / "state"))
    with FakeOpenAI() as url:
        report = _gate(url, None, **STRICT)
    t = report.check("target")
    assert t.status == "error" and not report.passed
    assert "--record-reference" in t.reason and str(tmp_path / "state" / "references" / "fake.json") in t.reason
    with FakeOpenAI() as url:
        report = _gate(url, tmp_path / "missing.json", **STRICT)
    assert report.check("target").status == "error" and "not found" in report.check("target").reason


@pytest.mark.parametrize("change, needle", [
    ({"identity": {**IDENT, "quantization": "radiance_fp8"}}, "quantization 'radiance_fp8' (this profile: None)"),
    ({"identity": {**IDENT, "tp": 2}}, "tp 2 (this profile: 1)"),
    ({"held_text": {"sha256": "0" * 64}}, "another held text"),
    ({"greedy": {"max_tokens": 16}}, "max_tokens 16, the profile asks 32"),
    ({"kind": "something else"}, "not a version-1 target reference"),
])
def test_a_reference_recorded_for_something_else_is_an_error(reference, change, needle):
    doc = json.loads(reference.read_text())
    for key, value in change.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
    reference.write_text(json.dumps(doc))
    with FakeOpenAI() as url:
        report = _gate(url, reference, **STRICT)
    t = report.check("target")
    assert t.status == "error" and needle in t.reason and "--record-reference" in t.reason


def test_where_the_reference_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path / "state"))
    shipped = TargetConfig(reference="tiny-cpu")
    assert target.reference_path(shipped, "tiny-cpu") == REFERENCES_DIR / "tiny-cpu.json"
    assert target.reference_path(TargetConfig(reference="./refs/x.json"), "p") == Path("./refs/x.json")
    assert target.reference_path(TargetConfig(), "p") is None
    # one recorded on this machine for the profile comes first
    mine = target.recorded_path("tiny-cpu")
    mine.parent.mkdir(parents=True)
    mine.write_text("{}")
    assert target.reference_path(shipped, "tiny-cpu") == mine
    assert mine == tmp_path / "state" / "references" / "tiny-cpu.json"


@pytest.mark.parametrize("data, needle", [
    ({"target": {"bogus": 1}}, "Extra inputs are not permitted"),
    ({"target": {"min_prefix_agreement": 1.5}}, "not a share"),
    ({"target": {"min_full_agreement": -0.1}}, "not a share"),
    ({"target": {"max_nll_increase": -0.1}}, "greater than or equal to 0"),
    ({"target": {"held_text": "v99"}}, "unknown held text 'v99'"),
    ({"target": {"prompt_set": "v99"}}, "unknown prompt set 'v99'"),
    ({"target": {"reference": "no-such-profile"}}, "no shipped reference named 'no-such-profile'"),
    ({"target": {"max_tokens": 0}}, "greater than or equal to 1"),
])
def test_bad_target_settings_are_rejected_with_the_fix(data, needle):
    with pytest.raises(ValidationError) as exc:
        GateConfig.model_validate(data)
    assert needle in str(exc.value)


def test_a_bad_target_setting_in_a_profile_is_one_line_and_exit_2(tmp_path):
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["gate"].setdefault("target", {})["min_prefix_agreement"] = 2
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(cli, ["gate", str(path), "--url", "http://127.0.0.1:9"], catch_exceptions=False)
    assert res.exit_code == 2
    line = res.output.strip().splitlines()[-1]
    assert str(path) in line and "gate.target.min_prefix_agreement" in line and "fix:" in line


def _cli_profile(tmp_path: Path, **target_cfg) -> Path:
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data.update(name="fake", model={**data["model"], "served_name": MODEL})
    data["gate"] = {"target": target_cfg, "acceptance": {"enabled": False}}
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_records_a_reference_from_an_endpoint_and_gates_by_it(tmp_path):
    env = {"RADIANCE_HOME": str(tmp_path / "state")}
    profile = _cli_profile(tmp_path, **STRICT)
    runner = CliRunner()
    with FakeOpenAI() as url:
        res = runner.invoke(cli, ["gate", str(profile), "--record-reference", "--url", url, "--json"], env=env,
                            catch_exceptions=False)
        assert res.exit_code == 0, res.output
        summary = json.loads(res.output)
        written = tmp_path / "state" / "references" / "fake.json"
        assert summary["reference"] == str(written) and written.is_file()
        doc = json.loads(written.read_text())
        assert doc["identity"] == target.identity(load_profile(profile))
        assert doc["source"].startswith("endpoint ") and doc["profile"] == "fake"
        res = runner.invoke(cli, ["gate", str(profile), "--url", url, "--json", "--reports-dir",
                                  str(tmp_path / "r")], env=env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
    with FakeOpenAI(nll=1.9) as url:
        res = runner.invoke(cli, ["gate", str(profile), "--url", url, "--json", "--reports-dir",
                                  str(tmp_path / "r")], env=env, catch_exceptions=False)
    assert res.exit_code == 3
    assert json.loads(res.output)["reason"] == ("target fail: mean NLL +0.4000 nats/token against stock "
                                                "(allowed +0.05)")


def test_cli_output_needs_record_reference(tmp_path):
    res = CliRunner().invoke(cli, ["gate", str(_cli_profile(tmp_path, min_prefix_agreement=0.2)), "--url",
                                   "http://127.0.0.1:9", "--output",
                                   str(tmp_path / "x.json")], catch_exceptions=False)
    assert res.exit_code == 2 and "--output is for --record-reference" in res.output


REAL = ("qwen3next-tp2", "qwen3.5-27b-w4-tp2", "qwen3.5-27b-dflash-tp2", "qwen3next-80b-tp2")


@pytest.mark.parametrize("name", REAL)
def test_the_real_profiles_run_the_target_check_and_ship_no_reference(name):
    # recorded on the target machine with --record-reference; there is no such machine here
    t = load_profile(REPO / "profiles" / f"{name}.yaml").gate.target
    assert t.enabled and t.reference is None and t.max_nll_increase is not None


@pytest.mark.parametrize("path", sorted((REPO / "profiles").glob("tiny-cpu*.yaml")), ids=lambda p: p.stem)
def test_the_tiny_profiles_ship_a_reference_that_matches_them(path):
    p = load_profile(path)
    t = p.gate.target
    assert t.enabled and t.reference == p.name and t.thresholds_set()
    doc = target.load_reference(REFERENCES_DIR / f"{t.reference}.json")
    assert doc["identity"] == target.identity(p)
    assert doc["held_text"]["sha256"] == target.load_held_text(t.held_text).sha256
    assert doc["greedy"]["max_tokens"] == t.max_tokens and len(doc["greedy"]["outputs"]) == 16


def test_the_stock_run_is_the_profile_with_its_features_off():
    from launcher.gate import stock

    p = load_profile(REPO / "profiles" / "tiny-cpu-tp2.yaml")
    s = stock.stock_profile(p)
    assert s.features.enabled_names() == [] and p.features.enabled_names()
    assert (s.drafter, s.model, s.parallel, s.vllm_args, s.env) == (p.drafter, p.model, p.parallel, p.vllm_args, p.env)
    assert target.identity(s) == target.identity(p)
