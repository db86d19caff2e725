"""4-bit target weights under the fp8 stream, for real: `radiance up profiles/tiny-cpu-w4-tp2.yaml` (the
trained tiny Qwen3.5 at TP=2 on vLLM CPU, all four patches on, the target's decoder linears in 4 bits
through radiance_w4), then the same profile with fp8-stream off (same 4-bit weights, every linear on its
W4A16 path), then the bf16 model (no quantization, fp8-stream off), each served once and asked the same
greedy questions through the gateway, alone and 8 at a time (test_tiny_tp2.py's prompts and helpers).

* the 4-bit server: ready, the gate passed with the profile's thresholds, all four features applied in
  `radiance status --json`, and on both ranks the fp8-stream install line counts the fused sites and
  names every consumer's GEMM: all of them W4A8 (the report row in status says the same);
* agreement with the bf16 model (tokens before the first difference, per prompt) and fp8-stream off vs
  on at the same 4-bit weights are measured and printed: target-side, gated, not asserted equal (W4A8
  sees the epilogue's fp8 activation, W4A16 the bf16 one).
"""
from __future__ import annotations

import json

import pytest
import yaml

from .conftest import REPO
from .test_tiny_tp2 import _prefix_agreement, _serve

pytestmark = pytest.mark.e2e
PROFILE = REPO / "profiles" / "tiny-cpu-w4-tp2.yaml"
# every streamed site's consumers on the tiny Qwen3.5 (3 GDN + 1 attention layer): in_proj_qkvz + in_proj_ba
# after layers 1-2's input epilogues, qkv_proj after layer 3's, gate_up_proj after all four post-attention ones
CONSUMERS = 2 + 2 + 1 + 4


def _bf16_profile(tmp) -> str:
    data = yaml.safe_load(PROFILE.read_text())
    data["name"] += "-bf16"
    data["model"].pop("quantization")
    path = tmp / "tiny-cpu-w4-tp2-bf16.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not (REPO / "models" / "tiny-qwen3.5-trained" / "model.safetensors").exists():
        pytest.skip("the trained tiny Qwen3.5 is not in models/")
    root = tmp_path_factory.mktemp("tiny-w4-tp2")
    return {"w4": _serve(root, "w4", {}, PROFILE),
            "w4_stream_off": _serve(root, "w4-stream-off", {"fp8_stream": False}, PROFILE),
            "bf16": _serve(root, "bf16", {"fp8_stream": False}, _bf16_profile(root))}


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


def test_report_agreement_with_bf16_and_stream_off(served, capsys):
    with capsys.disabled():
        for mode in ("alone", "batch"):
            for a, b, what in (("w4", "bf16", "4-bit + fp8-stream (W4A8) vs bf16"),
                               ("w4_stream_off", "bf16", "4-bit, fp8-stream off (W4A16) vs bf16"),
                               ("w4", "w4_stream_off", "4-bit: fp8-stream on vs off")):
                agree, first = _prefix_agreement(served[a][mode], served[b][mode])
                print(f"[tiny w4 tp2] {what} ({mode}): prefix agreement {agree:.1%}, tokens before the "
                      f"first difference per prompt {first} (None: all 48 equal)")
        acc = next(c for c in served["w4"]["status"]["gate"]["checks"] if c["name"] == "acceptance")
        print(f"[tiny w4 tp2] gate acceptance, 4-bit target, all four on: {acc['reason']}")
    for name in served:
        assert all(len(t) == 48 for t in served[name]["alone"] + served[name]["batch"]), name
