"""The DFlash deployment in miniature: `radiance up profiles/tiny-cpu-dflash-tp2.yaml` (the trained tiny
Qwen3.5 at TP=2 on vLLM CPU with a tiny DFlash drafter; w4-drafter + fp8-stream + int4-head on), and the
same profile with the w4-drafter off (stock DFlash drafting), each served once.

* DFlash taps target layers 1 and 2 (auxiliary hidden states 2 and 3): fp8-stream must re-plan around
  them -- those two down sites stock, every other site streaming -- instead of declining;
* the w4-drafter converts the drafter's qkv / o / gate_up / down (not fc) and nothing of the target;
* draft-side, so lossless: greedy tokens identical to stock DFlash, alone and 8 at a time.
The drafter is the trained tiny one (models/tiny-qwen3.5-dflash-trained); the acceptance it reaches is
gated by the profile (calibrated) and printed.
"""
from __future__ import annotations

import pytest

from .conftest import REPO
from .test_tiny_tp2 import FLAT, MAX_TOKENS, _serve

pytestmark = pytest.mark.e2e
PROFILE = REPO / "profiles" / "tiny-cpu-dflash-tp2.yaml"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if not (REPO / "models" / "tiny-qwen3.5-trained" / "model.safetensors").exists():
        pytest.skip("the trained tiny Qwen3.5 is not in models/")
    root = tmp_path_factory.mktemp("tiny-dflash")
    return {"w4": _serve(root, "w4", {}, profile=PROFILE, model="tiny-dflash"),
            "stock": _serve(root, "stock", {"w4_drafter": False}, profile=PROFILE, model="tiny-dflash")}


def test_dflash_and_fp8_stream_run_together(served):
    st = served["w4"]["status"]
    assert st["ready"] is True and st["gate"]["passed"] is True
    patches = {p["feature"]: p["status"] for p in st["patches"] if p["feature"]}
    assert patches["fp8_stream"] == patches["w4_drafter"] == patches["int4_head"] == "applied", patches
    assert patches["dynamic_draft"] == "disabled"
    log = served["w4"]["log"]
    replanned = [ln for ln in log.splitlines() if "fp8-stream installed again around the auxiliary" in ln]
    assert len(replanned) == 2, log[-3000:]  # one per TP rank
    for line in replanned:
        assert "1 input + 4 post-attention epilogues over 4 layers (5 all-reduces fused)" in line, line
        assert "auxiliary hidden-state taps at [2, 3] kept stock" in line, line
    assert "fp8-stream taken off" not in log and "latched off" not in log


def test_w4_drafter_converts_the_dflash_drafter_only(served):
    log = served["w4"]["log"]
    for shape, name in (("256x256", "self_attn.qkv_proj"), ("256x128", "self_attn.o_proj"),
                        ("512x256", "mlp.gate_up_proj")):
        assert f"w4-drafter: bf16 {shape} model.layers.4.{name}: converted" in log
    assert "w4-drafter: bf16 256x512 model.fc: declined" in log
    assert "w4-drafter converted 4 drafter linears" in log
    assert "w4-drafter converted" not in served["stock"]["log"]


def test_w4_drafter_is_lossless_against_stock_dflash(served):
    for mode in ("alone", "batch"):
        got, want = served["w4"][mode], served["stock"][mode]
        assert all(len(t) == MAX_TOKENS for t in got + want)
        diff = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        assert not diff, f"{mode}: prompts {diff} differ from stock DFlash"
    acc = next(c for c in served["w4"]["status"]["gate"]["checks"] if c["name"] == "acceptance")
    print(f"\n[tiny dflash tp2] {len(FLAT)} prompts identical; gate acceptance: {acc['reason']}")
