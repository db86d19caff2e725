"""The report: JSON round trip, file naming, terminal table, self-contained HTML."""
from __future__ import annotations

import io
import json
import re

from rich.console import Console

from launcher.gate.report import render_html, render_table, save, write_html
from launcher.gate.result import CheckResult, GateReport


def _report(passed: bool = True, baseline: bool = True) -> GateReport:
    acc = {"mean_acceptance_length": 2.41, "acceptance_rate": 0.47, "num_drafts": 120,
           "per_position": [0.8, 0.45, 0.16], "thresholds": {"min_per_position": [0.7, 0.4, 0.1]},
           "prompt_set": {"name": "v1", "sha256": "x", "prompts": 16},
           "by_kind": {"code": {"mean_acceptance_length": 2.9, "acceptance_rate": 0.63, "num_drafts": 30}},
           "radiance": {"delta": {"radiance:draft_steps_total": 120}, "current": {"radiance:draft_tau": 0.28}}}
    if baseline:
        acc["baseline"] = {"mean_acceptance_length": 2.2, "per_position": [0.7, 0.35, 0.15]}
    gsm = {"accuracy": 0.8, "correct": 160, "num_questions": 200, "wilson95": [0.739, 0.85], "threshold": 0.85,
           "tolerance": 0.08, "pass_floor": 0.77, "strict_accuracy": 0.79, "flexible_accuracy": 0.8,
           "invalid_rate": 0.0, "request_errors": 0, "subset": True, "seed": 0, "num_shots": 5}
    return GateReport(
        checks=[CheckResult("smoke", "pass", "5 tokens in 0.10 s", {"completion_tokens": 5, "latency_s": 0.1}, 0.1),
                CheckResult("acceptance", "pass" if passed else "fail",
                            "" if passed else "mean acceptance length 2.410 < 2.5", acc, 3.2),
                CheckResult("gsm8k", "pass", "accuracy 0.800 <ok> & fine", gsm, 40.0)],
        model="qwen3-next", endpoint="http://127.0.0.1:8001", started_at="2025-01-01T00:00:00+00:00",
        finished_at="2025-01-01T00:00:43+00:00", duration_s=43.3,
        context={"profile": "qwen3next-tp2", "profile_hash": "0123abcd", "vllm_version": "0.32.0",
                 "features_applied": ["dynamic-draft"], "features_declined": {"fp8-stream": "tp=1"}},
        config={"smoke": {"enabled": True}})


def test_json_round_trip():
    r = _report(passed=False)
    again = GateReport.from_json(r.to_json())
    assert again == r
    d = json.loads(r.to_json())
    assert d["passed"] is False and d["reason"] == "acceptance fail: mean acceptance length 2.410 < 2.5"
    assert [c["status"] for c in d["checks"]] == ["pass", "fail", "pass"]
    assert d["schema_version"] == 1


def test_reason_when_passed():
    assert _report().reason == "passed: smoke, acceptance, gsm8k"


def test_save_timestamps_and_never_overwrites(tmp_path):
    r = _report()
    first, second = save(r, tmp_path / "reports"), save(r, tmp_path / "reports")
    assert first != second
    assert re.fullmatch(r"gate-qwen3next-tp2-\d{8}T\d{6}Z(-1)?\.json", first.name)
    assert GateReport.from_json(first.read_text()) == r


def test_table_shows_every_check():
    buf = io.StringIO()
    render_table(_report(passed=False), Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert "GATE FAILED" in out and "acceptance" in out and "gsm8k" in out and "MAL 2.41" in out
    assert "acc 0.800 [0.739, 0.850]" in out


def test_html_is_self_contained_with_curves(tmp_path):
    path = write_html(_report(), tmp_path / "gate.html")
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 2  # per-position curve and GSM8K bar
    assert page.count("<polyline") == 2  # features on and baseline
    assert "baseline (features off)" in page and "Wilson 95%" in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "").replace(
        "http://127.0.0.1:8001", "")
    assert "&lt;ok&gt; &amp; fine" in page  # text is escaped
    assert "radiance:draft_tau" in page


def test_html_without_acceptance_figures():
    r = _report()
    r.checks[1] = CheckResult("acceptance", "skipped", "no drafter in this profile")
    page = render_html(r)
    assert page.count("<svg") == 1 and "no drafter in this profile" in page
