"""`radiance bench` on real vLLM CPU: the embedded profile stock and with all its features, the report
(date, device, commit, per-set rows, the lossless check), and a planted violation that the check fails.

Two bench runs, three engines: ``stock,all`` at B = 1 and 4 with the reference kept loaded (each engine
started once, measured twice, alternating), then stock with a rejection sampler that accepts every draft
(tests/e2e/plant_accept_all, test-only), in the fresh-engine path.
"""
from __future__ import annotations

import json
import os

import pytest

from .conftest import REPO, radiance

pytestmark = pytest.mark.e2e

PLANT = REPO / "tests" / "e2e" / "plant_accept_all"


def _env(tmp_path) -> dict:
    env = dict(os.environ)
    env.update({"RADIANCE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"})
    env.setdefault("RADIANCE_CACHE_DIR", str(REPO / ".cache" / "radiance"))
    return env


def test_bench_stock_and_all_features_on_the_embedded_profile(tmp_path):
    out = tmp_path / "bench.json"
    proc = radiance("bench", "profiles/tiny-cpu.yaml", "--sets", "stock,all", "--batch", "1,4", "--max-tokens", "24",
                    "--lossless", "1,4", "--keep-reference", "--rounds", "2", "--commit", "0123abc", "--out", str(out),
                    env=_env(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "radiance bench tiny-cpu" in proc.stdout and "1.00x" in proc.stdout  # the table
    report = json.loads(out.read_text())
    assert report["commit"] == "0123abc" and report["date"] and report["device"].startswith("CPU")
    assert report["vllm"] == "0.32.0" and report["options"]["batches"] == [1, 4]
    stock, full = report["sets"]
    assert (stock["set"], stock["plugin"], full["features"]) == ("stock", False, ["dynamic_draft", "w4_drafter",
                                                                                  "int4_head"])
    for s in (stock, full):
        assert [r["batch"] for r in s["results"]] == [1, 4]
        for r in s["results"]:
            assert r["output_tokens"] == r["batch"] * 24 and r["decode_tok_s"] > 0 and r["ms_per_step"] > 0
            assert r["mean_acceptance_length"] > 1.0                          # MTP drafts were accepted
            assert r["lossless"]["ok"] and r["lossless"]["positions"] == r["batch"] * 24
        assert s["knobs"]["RADIANCE_ENABLE"] == ("1" if s["plugin"] else "0")
    assert all(r["vs_stock"] == 1.0 for r in stock["results"])
    assert all("vs_stock" in r for r in full["results"])
    applied = {row["feature"] for row in full["patch_status"] if row["status"] == "applied"}
    assert {"dynamic_draft", "w4_drafter", "int4_head"} <= applied
    assert full["results"][0]["counters"].get("radiance:draft_steps_total", 0) > 0
    assert stock["patch_status"] == []                                        # the plugin was off
    # one engine per set, each measured twice, stock and the set alternating; ratios within each pair
    assert report["reference"] == "stock" and report["options"]["keep_reference"]
    assert report["options"]["rounds_done"] == 2 and len(full["rounds"]) == 2 and len(stock["rounds"]) == 2
    assert all(r["decode_tok_s_spread"]["n"] == 2 and r["vs_stock_spread"]["n"] == 2 for r in full["results"])
    assert sorted(p.name for p in (tmp_path / "bench-logs").iterdir()) == ["all.log", "stock.log"]
    assert full["rounds"][0]["load_s"] == full["rounds"][1]["load_s"]   # one start, not two


def test_bench_fails_a_decoder_that_accepts_wrong_drafts(tmp_path):
    out = tmp_path / "planted.json"
    env = _env(tmp_path)
    plant = f"{PLANT}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(PLANT)
    proc = radiance("bench", "profiles/tiny-cpu.yaml", "--sets", "stock", "--batch", "4", "--max-tokens", "24",
                    "--lossless", "4", "--engine-env", f"PYTHONPATH={plant}", "--out", str(out), env=env, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "not the target's argmax" in proc.stderr
    verdict = json.loads(out.read_text())["sets"][0]["lossless"]
    assert not verdict["ok"] and verdict["violations"] > 0 and verdict["first_violations"][0]["margin"] > verdict["eps"]
    assert json.loads(out.read_text())["sets"][0]["results"][0]["mean_acceptance_length"] == 3.0   # k=2: all taken
