"""4-bit target weights under the fp8 stream, for real: `radiance up profiles/tiny-cpu-w4-tp2.yaml` (the
trained tiny Qwen3.5 at TP=2 on vLLM CPU, all four patches on, the target's decoder linears in 4 bits
through radiance_w4), served once and asked test_tiny_tp2.py's greedy questions through the gateway, alone
and 8 at a time: ready, the gate passed with the profile's thresholds, all four features applied in
`radiance status --json`, and on both ranks the fp8-stream install line counts the fused sites and names
every consumer's GEMM: all of them W4A8 (the report row in status says the same).

How far 4 bits move the greedy path from the bf16 model, with fp8-stream on or off, is a measurement, not
an assertion (target-side: the gate decides): `tools/target_calibration.py profiles/tiny-cpu-w4-tp2.yaml`
measures it; docs/benchmarks.md keeps the last figures.
"""
from __future__ import annotations

import json

import pytest

from .conftest import REPO
from .test_tiny_tp2 import MAX_TOKENS, _serve

pytestmark = pytest.mark.e2e
PROFILE = REPO / "profiles" / "tiny-cpu-w4-tp2.yaml"
# every streamed site's consumers on the tiny Qwen3.5 (3 GDN + 1 attention layer): in_proj_qkvz + in_proj_ba
# after layers 1-2's input epilogues, qkv_proj after layer 3's, gate_up_proj after all four post-attention ones
CONSUMERS = 2 + 2 + 1 + 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not (REPO / "models" / "tiny-qwen3.5-trained" / "model.safetensors").exists():
        pytest.skip("the trained tiny Qwen3.5 is not in models/")
    root = tmp_path_factory.mktemp("tiny-w4-tp2")
    return {"w4": _serve(root, "w4", {}, PROFILE)}


def test_every_consumer_runs_w4a8_and_the_gate_passed(served):
    st = served["w4"]["status"]
    assert st["ready"] is True and st["gate"]["passed"] is True, json.dumps(st["gate"])[:2000]
    rows = {p["feature"]: p for p in st["patches"] if p["feature"]}
    for feature in ("dynamic_draft", "w4_drafter", "int4_head", "fp8_stream"):
        assert rows[feature]["status"] == "applied", (feature, rows[feature])
    assert f"consumers: {CONSUMERS} w4a8" in rows["fp8_stream"]["reason"], rows["fp8_stream"]
    installed = [ln for ln in served["w4"]["log"].splitlines() if "radiance: fp8-stream installed:" in ln]
    assert len(installed) == 2, served["w4"]["log"][-3000:]  # one line per TP rank
    for line in installed:
        assert "3 input + 4 post-attention epilogues over 4 layers (7 all-reduces fused)" in line, line
        assert line.rstrip().endswith(f"consumers: {CONSUMERS} w4a8"), line  # no other GEMM among them
    assert "latched off" not in served["w4"]["log"]
    assert all(len(t) == MAX_TOKENS for t in served["w4"]["alone"] + served["w4"]["batch"])
