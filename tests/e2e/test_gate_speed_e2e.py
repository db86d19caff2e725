"""The speed check against real vLLM (CPU, the shared tiny engine): a reference recorded from the engine
itself; the gate at the engine's own speed reports (the CPU default: report-only), and with the check
enforced (RADIANCE_GATE_SPEED_ENFORCE, the test-only switch) fails, in one line, once the slow-sampler plant
(tests/e2e/plant_slow_sampler) sleeps in every engine step. The own-speed run is not enforced: on this
2-core machine stock's ratio to its own reference stayed within 0.873-1.011 while the machine was quiet but
spread 0.19-2.14 while other jobs loaded it (launcher/gate/config.py), and CI shares its cores, so the
slowdown asserted to fail here stays below the bound even at the top of that spread (B=1: ~0.27x stock,
2.14x of which is under 0.85)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, radiance

pytestmark = pytest.mark.e2e
STEP_SLEEP_S = "0.1"  # per engine step: ~5x a tiny-model decode step here (B=1: 32 tokens in ~0.55 s)


def _speed_only_profile(tmp_path: Path, reference: Path) -> Path:
    """tiny-cpu, its features on, judged by a reference recorded from the same engine; only smoke and speed
    run (the target and acceptance checks have their own tests)."""
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["name"] = "tiny-speed"
    data["gate"]["target"].update(enabled=False, reference=str(reference))
    data["gate"]["acceptance"]["enabled"] = False
    path = tmp_path / "tiny-speed.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _gate(tiny, profile: Path, tmp_path: Path, enforce: bool):
    env = dict(tiny.env, RADIANCE_GATE_SPEED_ENFORCE="1" if enforce else "0")
    res = radiance("gate", str(profile), "--url", tiny.base, "--json", "--reports-dir", str(tmp_path), env=env)
    report = json.loads(res.stdout)
    return res.returncode, report, next(c for c in report["checks"] if c["name"] == "speed")


def test_the_speed_check_reports_on_the_cpu_and_fails_a_planted_slowdown_when_enforced(tiny, tmp_path):
    flag = Path(tiny.env["E2E_SLOW_SAMPLER_FLAG"])
    reference = tmp_path / "ref.json"
    profile = _speed_only_profile(tmp_path, reference)
    rec = radiance("gate", str(profile), "--record-reference", "--url", tiny.base, "--output", str(reference),
                   "--json", env=tiny.env)
    assert rec.returncode == 0, rec.stdout + rec.stderr
    stock = json.loads(rec.stdout)["decode_tok_s"]
    assert set(stock) == {"1", "8"} and all(v > 0 for v in stock.values()), stock

    code, report, speed = _gate(tiny, profile, tmp_path, enforce=False)
    assert code == 0 and speed["status"] == "pass", report["reason"]
    m = speed["metrics"]
    assert m["enforced"] is False and m["platform"] == "cpu" and m["reference_decode_tok_s"] == stock
    assert set(m["ratio"]) == set(m["decode_tok_s"]) == {"1", "8"}
    assert speed["reason"].startswith("report-only on cpu: ")
    print(f"\n[speed e2e] own reference: {speed['reason']}")

    flag.write_text(STEP_SLEEP_S)
    try:
        code, report, speed = _gate(tiny, profile, tmp_path, enforce=True)
        assert code == 3 and speed["status"] == "fail", report["reason"]
        reason = report["reason"]
        assert "\n" not in reason and reason.startswith("speed fail: dynamic_draft+w4_drafter+int4_head decodes at ")
        assert reason.endswith("one at a time and gate again; the one whose removal passes costs it"), reason
        assert speed["metrics"]["enforced"] is True and speed["metrics"]["below_min"] is True
        print(f"[speed e2e] planted {STEP_SLEEP_S} s per step, enforced: {reason}")
    finally:
        flag.unlink(missing_ok=True)
