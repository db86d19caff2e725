"""The tiny generator's numerics variant the fp8-stream e2e serves (dense layers, decisive
logits, distinct norms); the default model must stay byte-identical."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tools.tinymodel import config, generate_into, weights


def test_default_layout_and_config_are_unchanged():
    assert config.tensor_layout() == config.tensor_layout(())
    assert config.hf_config(bos_id=None, eos_id=2, pad_id=0)["mlp_only_layers"] == []
    assert config.hf_config(bos_id=None, eos_id=2, pad_id=0)["intermediate_size"] == config.DENSE_INTERMEDIATE


def test_every_layer_dense_is_refused():
    with pytest.raises(ValueError, match="at least one sparse-MoE layer"):
        config.check_mlp_only_layers(range(config.NUM_LAYERS))
    with pytest.raises(ValueError, match="indices"):
        config.check_mlp_only_layers([config.NUM_LAYERS])


def test_variant_writes_dense_mlps_where_asked(tmp_path):
    out = generate_into(tmp_path / "m", seed=0, mlp_only_layers=(0, 1, 2), embed_scale=16.0, norm_std=0.1)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["mlp_only_layers"] == [0, 1, 2]
    sd = load_file(str(out / "model.safetensors"))
    assert set(sd) == {name for name, _, _ in config.tensor_layout((0, 1, 2))}
    assert sd["model.layers.0.mlp.gate_proj.weight"].shape == (config.DENSE_INTERMEDIATE, config.HIDDEN)
    assert "model.layers.3.mlp.gate.weight" in sd and "model.layers.2.mlp.gate.weight" not in sd
    assert "mtp.layers.0.mlp.down_proj.weight" in sd  # vLLM indexes the MTP layer as 0
    base = weights.random_state_dict(0)
    ratio = sd["model.embed_tokens.weight"].float().std() / base["model.embed_tokens.weight"].float().std()
    assert 15.5 < float(ratio) < 16.5
    norms = [sd[f"model.layers.{i}.input_layernorm.weight"] for i in range(2)]
    assert not torch.equal(norms[0], norms[1]) and float(norms[0].float().std()) > 0.05
    meta = json.loads((out / "radiance_tiny.json").read_text())
    assert meta["variant"] == {"mlp_only_layers": [0, 1, 2], "embed_scale": 16.0, "norm_std": 0.1}
