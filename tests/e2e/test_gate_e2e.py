"""The gate against real vLLM (CPU, tiny model): pass, fail, --url, and the counters it reads; the
target check passes the shipped tiny profile against its shipped stock reference and fails a target whose
int4 head carries a planted scale error (tests/e2e/plant_head_scale, on that engine's PYTHONPATH only)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest
import yaml

from .conftest import REPO, radiance, start

pytestmark = pytest.mark.e2e
PLANT = Path(__file__).resolve().parent / "plant_head_scale"


def _profile_with(tmp_path: Path, **acceptance) -> Path:
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["name"] = "tiny-strict"
    data["gate"]["acceptance"].update(acceptance)
    data["gate"]["target"]["enabled"] = False  # what these runs judge is acceptance; the target has its own test
    path = tmp_path / "tiny-strict.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_gate_url_against_running_endpoint_passes_with_json(tiny, tmp_path):
    res = radiance("gate", str(REPO / "profiles/tiny-cpu.yaml"), "--url", tiny.base, "--json",
                   "--reports-dir", str(tmp_path), "--html", str(tmp_path / "gate.html"), env=tiny.env)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["passed"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["smoke"]["status"] == "pass" and checks["acceptance"]["status"] == "pass"
    assert checks["acceptance"]["metrics"]["num_drafts"] > 0
    # int4-head is on: a lossy head, within the profile's stated thresholds of the shipped stock reference
    t = checks["target"]
    assert t["status"] == "pass" and t["metrics"]["reference"].endswith("references/tiny-cpu.json"), t
    assert t["metrics"]["nll_increase"] <= t["metrics"]["thresholds"]["max_nll_increase"]
    # The same document `radiance up` saved for its own gate run: same checks, same metric keys.
    up_report = json.loads(Path(tiny.state()["gate_report"]).read_text())
    assert [c["name"] for c in up_report["checks"]] == [c["name"] for c in report["checks"]]
    up_checks = {c["name"]: c for c in up_report["checks"]}
    assert set(up_checks["acceptance"]["metrics"]) == set(checks["acceptance"]["metrics"])
    assert up_checks["target"]["metrics"]["mean_nll"] == t["metrics"]["mean_nll"]
    assert "<svg" in (tmp_path / "gate.html").read_text()


def test_gate_url_fails_with_thresholds_the_tiny_model_cannot_meet(tiny, tmp_path):
    strict = _profile_with(tmp_path, min_mean_acceptance_length=2.5)
    res = radiance("gate", str(strict), "--url", tiny.base, "--json", "--reports-dir", str(tmp_path), env=tiny.env)
    assert res.returncode == 3, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["passed"] is False and "acceptance" in report["reason"]


def test_spec_decode_counters_match_vllms_own_log(tiny):
    """What the gate reads from /metrics equals the sum of vLLM's 'SpecDecoding metrics' log lines."""
    from launcher.gate.metrics import parse

    def totals():
        return parse(httpx.get(tiny.base + "/metrics", timeout=30).text).spec

    def logged():
        text = Path(tiny.state()["engine_log"]).read_text()
        acc = sum(int(m) for m in re.findall(r"SpecDecoding metrics:.*?Accepted: (\d+) tokens", text))
        drafted = sum(int(m) for m in re.findall(r"SpecDecoding metrics:.*?Drafted: (\d+) tokens", text))
        return acc, drafted

    deadline = time.monotonic() + 60  # vLLM logs its stats every 10 s
    while True:
        m = totals()
        if logged() == (int(m.accepted), int(m.draft_tokens)) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert m.draft_tokens > 0
    assert logged() == (int(m.accepted), int(m.draft_tokens))


def test_a_damaged_target_fails_the_gate_keeps_the_endpoint_unready_and_exits_3(tmp_path):
    """int4-head with every output row's first group scale doubled: the drafter shares the head, so its
    drafts still agree with the (damaged) target and acceptance alone would pass it."""
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["name"] = "tiny-damaged"
    data["env"].update({"E2E_HEAD_SCALE_ERROR": "2.0",
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(PLANT), os.environ.get("PYTHONPATH")]))})
    profile = tmp_path / "tiny-damaged.yaml"
    profile.write_text(yaml.safe_dump(data))
    dep = start(tmp_path, str(profile), args=("--keep-serving-unready",))
    try:
        assert dep.up.returncode == 3, dep.up.stdout + dep.up.stderr
        r = httpx.get(dep.base + "/v1/health/ready", timeout=5)
        reason = r.json()["reason"]
        assert r.status_code == 503 and reason.startswith("gate failed: target fail: mean NLL +"), reason
        assert "\n" not in reason and "nats/token against stock (allowed +" in reason
        assert httpx.post(dep.base + "/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 503
        assert 200 not in dep.ready_codes
        gate = json.loads(Path(dep.state()["gate_report"]).read_text())
        target = next(c for c in gate["checks"] if c["name"] == "target")
        print(f"\n[gate e2e] planted head scale error: {target['reason']} (acceptance: "
              f"{next(c for c in gate['checks'] if c['name'] == 'acceptance')['reason']})")
    finally:
        dep.down()
