"""fp8-stream on real vLLM (CPU, gloo, TP=2) serving a block-fp8 checkpoint with radiance_fp8.

The checkpoint is the tiny generator's ``fp8_blocks`` variant (tools/tinymodel/fp8.py),
written into tmp: e4m3 weights with 128x128 ``weight_scale_inv`` wherever a TP=2 shard holds
whole blocks, the rest (GDN in_proj_ba, the full-attention q/k/v, gates, experts) bf16 and
listed in ``modules_to_not_convert``. ``--quantization radiance_fp8`` takes it over
(radiance/fp8_stream/block.py), so the consumers read group-128 activations. Stream on must
install the epilogues of the layer plan (group 128) and give the same greedy tokens as stream
off, alone and batched. Two vLLM starts in all.
"""
from __future__ import annotations

import json

import pytest

from .test_fp8_stream_tp2 import DENSE_LAYERS, _lines, _run

pytestmark = pytest.mark.e2e


def expected_epilogues(config: dict) -> tuple[int, int]:
    """(input, post-attention) epilogues the plan must install: a dense MLP consumes its
    layer's post-attention epilogue, and its down_proj defers into the next layer's input."""
    dense = set(config["mlp_only_layers"])
    n = config["num_hidden_layers"]
    return sum(1 for i in range(1, n) if i - 1 in dense), len(dense)


@pytest.fixture(scope="module")
def block_model(tmp_path_factory):
    from tools.tinymodel import generate_into

    return generate_into(tmp_path_factory.mktemp("fp8blk") / "block", seed=0, mlp_only_layers=DENSE_LAYERS,
                         embed_scale=16.0, norm_std=0.1, fp8_blocks=True)


def test_tp2_block_fp8_checkpoint_stream_equals_stock(block_model, tmp_path):
    cfg = json.loads((block_model / "config.json").read_text())
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    on, log_on = _run(block_model, tmp_path / "on.json", 2, True)
    off, log_off = _run(block_model, tmp_path / "off.json", 2, False)
    n_in, n_mid = expected_epilogues(cfg)
    installed = _lines(log_on, "installed")
    assert len(installed) == 2, log_on[-3000:]  # one line per TP rank
    for line in installed:
        assert f"{n_in} input + {n_mid} post-attention epilogues over 4 layers" in line, line
        assert "3: post-attention: mlp (Qwen3NextSparseMoeBlock) takes no pre-quantised input" in line
    assert "quantization=radiance_fp8" in log_on
    assert not _lines(log_off, "") and "latched off" not in log_on + log_off
    assert on["alone"] == off["alone"]
    assert on["batched"] == off["batched"]
    assert on["alone"] == on["batched"]
    assert len({tok for seq in on["batched"] for tok in seq}) > 20  # not a degenerate loop
    print(f"\n[fp8-stream block] {installed[0].split('radiance: ')[-1]}")
    print(f"[fp8-stream block] min greedy margin {on['min_margin']:.3f}, "
          f"{on['margins_below_0.05']} of {on['n_tokens']} below 0.05")
