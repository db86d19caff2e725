"""The speed check against fake endpoints whose decode speed is set (FakeOpenAI.token_s): a reference
recorded from one, then the same speed, half the speed, on the CPU and elsewhere; what a reference without
figures or with another workload says; the config's refusals; the report's one row. Real vLLM:
tests/e2e/test_gate_speed_e2e.py."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from rich.console import Console

from launcher.cli import cli
from launcher.gate import GateConfig, run_gate, speed, target
from launcher.gate.client import Client
from launcher.gate.config import DEFAULT_MIN_RATIO, SpeedConfig, TargetConfig
from launcher.gate.report import key_metrics, render_table

from test_gate_runner_fake_endpoint import MODEL, FakeOpenAI  # its directory is on sys.path (rootdir-less tests)
from test_gate_target import IDENT, _cli_profile

# The fake's stock decode speed: 100 tok/s per request; rounds of ~0.3 s, long against the HTTP overhead that
# a loaded 2-core machine adds to each round.
TOKEN_S = 0.01


def _gate(url: str, ref: Path, *, platform: str | None, features: list[str], **speed_cfg):
    cfg = GateConfig.model_validate({"target": {"enabled": False}, "acceptance": {"enabled": False},
                                     "speed": speed_cfg})
    return run_gate(cfg, url, model=MODEL, progress=False, reference=ref, identity=IDENT,
                    context={"profile": "fake", "platform": platform, "features_enabled": features})


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("speed") / "ref.json"

    async def go(url: str) -> dict:
        async with Client(url, api_key=None, timeout_s=10, retries=0, concurrency=1) as client:
            doc = await target.record(client, TargetConfig(), model=MODEL, ident=IDENT, profile="fake",
                                      source="test")
        doc["speed"] = await speed.record(url, None, SpeedConfig(), model=MODEL, platform="cpu")
        return doc

    with FakeOpenAI(token_s=TOKEN_S) as url:
        doc = asyncio.run(go(url))
    target.write_reference(doc, path)
    return path


def test_the_reference_holds_decode_speed_per_batch_size(reference):
    s = json.loads(reference.read_text())["speed"]
    assert s["platform"] == "cpu" and sorted(s["decode_tok_s"]) == ["1", "8"]
    assert s["workload"]["max_tokens"] == 32 and s["workload"]["prompt_set"]["name"] == "v1"
    # One request decodes at ~1 / TOKEN_S; eight sent together, each as fast: ~8x that (loosely: the
    # subtraction of the one-token round carries the machine's noise).
    assert 50 < s["decode_tok_s"]["1"] < 200 and 4 < s["decode_tok_s"]["8"] / s["decode_tok_s"]["1"] < 16


def test_the_same_speed_passes_enforced(reference, monkeypatch):
    monkeypatch.setenv("RADIANCE_GATE_SPEED_ENFORCE", "1")
    with FakeOpenAI(token_s=TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=["int4_head"])
    c = report.check("speed")
    assert c.status == "pass", c.reason
    assert c.metrics["enforced"] is True and c.metrics["below_min"] is False
    assert all(DEFAULT_MIN_RATIO < r < 1.25 for r in c.metrics["ratio"].values()), c.metrics["ratio"]
    assert set(c.metrics["reference_decode_tok_s"]) == set(c.metrics["decode_tok_s"]) == {"1", "8"}


def test_a_third_of_the_speed_fails_in_one_line_naming_the_feature_and_the_fix(reference, monkeypatch):
    monkeypatch.setenv("RADIANCE_GATE_SPEED_ENFORCE", "1")
    with FakeOpenAI(token_s=3 * TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=["int4_head"])
    c = report.check("speed")
    assert c.status == "fail" and not report.passed
    assert "\n" not in report.reason
    assert report.reason.startswith("speed fail: int4_head decodes at 0.")
    assert "x (B=1), 0." in report.reason and "x (B=8) of stock's tok/s" in report.reason
    assert report.reason.endswith(f"(min {DEFAULT_MIN_RATIO:g}) — fix: set features.int4_head: false")
    assert all(r < 0.6 for r in c.metrics["ratio"].values()), c.metrics["ratio"]


def test_on_the_cpu_a_slowdown_is_reported_not_failed(reference, monkeypatch):
    monkeypatch.delenv("RADIANCE_GATE_SPEED_ENFORCE", raising=False)
    with FakeOpenAI(token_s=3 * TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=["dynamic_draft", "int4_head"])
    c = report.check("speed")
    assert report.passed and c.status == "pass"
    assert c.metrics["enforced"] is False and c.metrics["below_min"] is True
    assert c.reason.startswith("report-only on cpu: dynamic_draft+int4_head decodes at 0.")
    assert "features.dynamic_draft, features.int4_head false one at a time" in c.reason


def test_off_the_cpu_a_slowdown_fails_without_the_switch(reference, monkeypatch):
    monkeypatch.delenv("RADIANCE_GATE_SPEED_ENFORCE", raising=False)
    with FakeOpenAI(token_s=3 * TOKEN_S) as url:
        report = _gate(url, reference, platform="cuda", features=["w4_drafter"])
    assert report.check("speed").status == "fail"
    assert report.reason.endswith("fix: set features.w4_drafter: false")


def test_the_platform_comes_from_the_reference_when_the_endpoint_does_not_say(reference, monkeypatch):
    monkeypatch.delenv("RADIANCE_GATE_SPEED_ENFORCE", raising=False)
    with FakeOpenAI(token_s=3 * TOKEN_S) as url:
        report = _gate(url, reference, platform=None, features=[])
    c = report.check("speed")
    assert c.status == "pass" and c.metrics["platform"] == "cpu" and c.metrics["enforced"] is False
    assert "no feature is on" in c.reason


def test_a_bad_switch_value_is_an_error_that_names_it(reference, monkeypatch):
    monkeypatch.setenv("RADIANCE_GATE_SPEED_ENFORCE", "maybe")
    with FakeOpenAI(token_s=TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=[])
    c = report.check("speed")
    assert c.status == "error" and "RADIANCE_GATE_SPEED_ENFORCE='maybe'" in c.reason


def test_a_reference_without_speed_figures_skips_with_the_fix(tmp_path, reference):
    doc = json.loads(reference.read_text())
    del doc["speed"]
    old = target.write_reference(doc, tmp_path / "old.json")
    with FakeOpenAI(token_s=TOKEN_S) as url:
        report = _gate(url, old, platform="cuda", features=[])
    c = report.check("speed")
    assert c.status == "skipped" and "has no speed figures — fix: record one on this machine" in c.reason
    assert report.passed


def test_a_reference_of_another_workload_is_an_error(reference):
    with FakeOpenAI(token_s=TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=[], max_tokens=16)
    c = report.check("speed")
    assert c.status == "error" and "timed another workload" in c.reason and "fix:" in c.reason


def test_a_batch_size_the_reference_lacks_is_an_error(reference):
    with FakeOpenAI(token_s=TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=[], batch_sizes=[1, 4])
    assert "has no figure at B=4" in report.check("speed").reason


@pytest.mark.parametrize("bad, says", [({"batch_sizes": [8, 1]}, "strictly increasing"),
                                       ({"batch_sizes": []}, "strictly increasing"),
                                       ({"min_ratio": 0}, "greater than 0"),
                                       ({"max_tokens": 1}, "greater than or equal to 2"),
                                       ({"prompt_set": "v99"}, "unknown prompt set")])
def test_the_config_refuses(bad, says):
    with pytest.raises(ValidationError, match=says):
        SpeedConfig(**bad)


def test_a_bad_speed_field_in_a_profile_exits_2_with_one_line(tmp_path):
    import yaml

    path = _cli_profile(tmp_path, min_prefix_agreement=0.2)
    data = yaml.safe_load(path.read_text())
    data["gate"]["speed"] = {"batch_sizes": [8, 1]}
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(cli, ["gate", str(path), "--url", "http://127.0.0.1:9"], catch_exceptions=False)
    assert res.exit_code == 2
    line = res.output.strip().splitlines()[-1]
    assert str(path) in line and "gate.speed.batch_sizes" in line and "fix:" in line


def test_the_report_shows_speed_in_one_row(reference, monkeypatch):
    monkeypatch.delenv("RADIANCE_GATE_SPEED_ENFORCE", raising=False)
    with FakeOpenAI(token_s=TOKEN_S) as url:
        report = _gate(url, reference, platform="cpu", features=[])
    row = key_metrics(report.check("speed"))
    assert row.startswith("B=1 ") and " B=8 " in row and row.endswith(f"min {DEFAULT_MIN_RATIO:.2f}, report-only")
    console = Console(record=True, width=300)
    render_table(report, console)
    assert sum(line.lstrip("│ ").startswith("speed ") for line in console.export_text().splitlines()) == 1
