"""fp8-stream on real vLLM (CPU, gloo), quantised online with radiance_fp8, where it must decline: at
TP=1 and on the all-MoE trained model (no consumer takes (q, scale)) it declines in one line per process
and serves stock.

Where it applies, its tokens against the stock fp8 path are proven by the servers that already run it:
test_tiny_tp2.py (the trained tiny Qwen3.5 at TP=2, fp8-stream on vs the same radiance_fp8 linears
without the contract, token for token, with the install line's epilogue count) and
test_fp8_stream_block_tp2.py (a Qwen3-Next with a MoE layer, block-fp8 checkpoint, on vs off); the
plan's per-site reasons are unit-tested in tests/radiance/fp8_stream/test_fp8_stream_plan.py.

The TP=1 model is the tiny generator's numerics variant (tools/tinymodel/weights.py): layers 0-2 dense
(vLLM's Qwen3NextForCausalLM needs one MoE layer, so layer 3 keeps one), so a site would qualify but
for the tensor parallel size.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent
TRAINED = HERE.parents[1] / "models" / "tiny-qwen3next-trained"
DENSE_LAYERS = (0, 1, 2)


def _run(model: Path, out: Path, tp: int, stream: bool) -> tuple[dict, str]:
    env = dict(os.environ, RADIANCE_ENABLE="1", RADIANCE_FP8_STREAM="1" if stream else "0",
               VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "0", VLLM_CPU_KVCACHE_SPACE="1",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(HERE / "fp8_stream_greedy.py"), str(model), str(out),
                           "--tp", str(tp)], env=env, capture_output=True, text=True, timeout=900, check=False)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return json.loads(out.read_text()), log


def _lines(log: str, what: str) -> list[str]:
    return [ln for ln in log.splitlines() if f"radiance: fp8-stream {what}" in ln]


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory) -> Path:
    from tools.tinymodel import generate_into

    return generate_into(tmp_path_factory.mktemp("fp8s") / "dense", seed=0, mlp_only_layers=DENSE_LAYERS,
                         embed_scale=16.0, norm_std=0.1)


@pytest.fixture(scope="module")
def runs(dense_model, tmp_path_factory):
    """Each configuration once, on demand (every vLLM start costs a minute or two here)."""
    cache: dict = {}
    root = tmp_path_factory.mktemp("fp8s-runs")

    def get(model: str, tp: int, stream: bool):
        key = (model, tp, stream)
        if key not in cache:
            path = dense_model if model == "dense" else TRAINED
            cache[key] = _run(path, root / f"{model}-tp{tp}-{int(stream)}.json", tp, stream)
        return cache[key]

    return get


def test_tp1_declines_in_one_line_and_serves_stock(runs):
    on, log_on = runs("dense", 1, True)
    declined = _lines(log_on, "declined")
    assert len(declined) == 1 and "tensor parallel size is 1" in declined[0], log_on[-3000:]
    # declined means nothing of the contract is on the model: no install line, no latch, and it serves
    assert not _lines(log_on, "installed") and "latched off" not in log_on
    assert all(len(seq) == 24 for seq in on["alone"] + on["batched"])


def test_all_moe_model_declines_with_the_moe_reason(runs):
    if not (TRAINED / "model.safetensors").exists():
        pytest.skip("trained tiny model not present")
    out, log = runs("trained", 2, True)
    declined = _lines(log, "declined")
    assert len(declined) == 2, log[-3000:]
    for line in declined:
        assert ("no site qualifies (layer 0: post-attention: mlp (Qwen3NextSparseMoeBlock) takes no "
                "pre-quantised input") in line
    assert not _lines(log, "installed") and all(len(seq) == 24 for seq in out["batched"])
