"""The spine, for real: profile → check → vLLM (CPU) with the plugin → gate → gated endpoint."""
from __future__ import annotations

import json

import httpx
import pytest

from .conftest import SECRET, radiance

pytestmark = pytest.mark.e2e


def test_ready_was_503_before_the_gate_and_200_after(tiny):
    assert 503 in tiny.ready_codes, tiny.ready_codes
    assert tiny.ready_codes[-1] == 200, tiny.ready_codes
    assert tiny.ready_codes.index(503) < len(tiny.ready_codes) - 1
    assert httpx.get(tiny.base + "/v1/health/live").status_code == 200


def test_completion_through_the_gateway_returns_text(tiny):
    r = httpx.post(tiny.base + "/v1/completions", timeout=120,
                   json={"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert isinstance(text, str) and len(text) > 0


def test_streaming_chat_through_the_gateway(tiny):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
            "temperature": 0, "stream": True}
    events = []
    with httpx.stream("POST", tiny.base + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]" and len(events) >= 3


def test_metrics_are_proxied_and_show_speculative_decoding(tiny):
    text = httpx.get(tiny.base + "/metrics", timeout=30).text
    assert "vllm:spec_decode_num_drafts_total" in text
    # dynamic_draft is applied here (test_status_reports_gate_and_patches): its counters ride vLLM's
    # spec-decode stats to the API server's /metrics, and the patch rows with them.
    steps = [ln for ln in text.splitlines() if ln.startswith("radiance:draft_steps_total")]
    assert steps and float(steps[0].split()[-1]) > 0, steps
    assert 'radiance:patch_status{' in text and 'feature="dynamic_draft"' in text


def test_status_reports_gate_and_patches(tiny):
    st = tiny.status()
    assert st["ready"] is True and st["phase"] == "ready"
    assert st["gate"]["passed"] is True
    features = {p["feature"]: p for p in st["patches"]}
    # The demo profile turns on every feature that applies at TP=1 (README: three patches applied).
    for feature in ("dynamic_draft", "w4_drafter", "int4_head"):
        assert features[feature]["status"] == "applied", (feature, features[feature])
    assert features["fp8_stream"]["status"] == "disabled"
    # The gate's traffic ran through the depth policy: its counters are there.
    assert st["telemetry"].get("draft_steps", 0) > 0, st["telemetry"]


def test_engine_really_runs_the_plugin(tiny):
    """Lines only the plugin inside vLLM writes (the supervisor's own first line is "[radiance] python -m
    vllm..."): its hook installs and what the patches did to the weights."""
    log = open(tiny.state()["engine_log"]).read()
    assert any("radiance: replaced" in ln and "Scheduler.schedule" in ln and " for dynamic_draft" in ln
               for ln in log.splitlines())
    assert "radiance: int4-head: lm_head" in log
    assert "radiance: w4-drafter converted" in log


def test_logs_command_prints_the_engine_log(tiny):
    res = radiance("logs", tiny.name, "--tail", "50", env=tiny.env, check=True)
    assert res.stdout.count("\n") >= 10 and "INFO" in res.stdout


def test_secrets_never_reach_logs_state_or_reports(tiny):
    from pathlib import Path

    home = Path(tiny.env["RADIANCE_HOME"])
    leaked = [str(p) for p in home.rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert leaked == []
    assert SECRET not in json.dumps(tiny.status())
