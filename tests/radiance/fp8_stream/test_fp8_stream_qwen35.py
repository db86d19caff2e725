"""fp8-stream on vLLM 0.32's Qwen3.5 classes, built on CPU from the tiny Qwen3.5's config (one gloo rank):
``Qwen3_5DecoderLayer`` (subclass of ``Qwen3NextDecoderLayer``, inherited forward, GemmaRMSNorm imported
as ``Qwen3_5RMSNorm``), the flat GDN projections vLLM fuses into a 4-shard qkvz and a 2-shard ba, dense
MLPs everywhere, and the text model's own tap setter (``Qwen3_5ForCausalLMBase.set_aux_hidden_state_layers``
writes the core's taps past the mixin)."""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("vllm.model_executor.models.qwen3_5")  # needs a torchvision that loads (make install)

from radiance.fp8_stream import contract
from radiance.fp8_stream.patch import Fp8StreamPatch
from radiance.fp8_stream.plan import attention_consumers, find_core, mlp_consumers, plan_stream


@pytest.fixture(scope="module")
def qwen35(tp1_group, tmp_path_factory):
    """The tiny Qwen3.5 CausalLM under radiance_fp8 (uninitialised weights: structure only)."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    import radiance.fp8_stream.linear  # noqa: F401  (registers radiance_fp8)
    from tools import tinymodel
    from tools.tinymodel import config

    path = tinymodel.ensure(tmp_path_factory.mktemp("q35"), arch=config.QWEN3_5.name)
    vc = VllmConfig(model_config=ModelConfig(model=str(path), dtype="bfloat16", enforce_eager=True,
                                             quantization="radiance_fp8"))
    vc.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16):
        return Qwen3_5ForCausalLM(vllm_config=vc, prefix="")


def test_every_qwen35_site_streams(qwen35):
    from vllm.model_executor.models.qwen3_5 import Qwen3_5DecoderLayer

    core = find_core(qwen35)
    assert type(core).__name__ == "Qwen3_5Model" and all(type(l) is Qwen3_5DecoderLayer for l in core.layers)
    gdn = core.layers[0].linear_attn
    assert not gdn.gqa_interleaved_layout
    assert gdn.in_proj_qkvz.output_sizes == [256, 256, 512, 512]  # flat q, k, v, z: 4 shards
    assert len(gdn.in_proj_ba.output_sizes) == 2                   # b, a
    assert [n for n, _ in attention_consumers(core.layers[0])] == ["linear_attn.in_proj_qkvz",
                                                                   "linear_attn.in_proj_ba"]
    assert [n for n, _ in mlp_consumers(core.layers[2])] == ["mlp.gate_up_proj"]
    plan = plan_stream(core, 2, 1)
    assert plan.declined is None and not any(lp.reasons for lp in plan.layers), plan.summary()
    assert plan.summary() == "3 input + 4 post-attention epilogues over 4 layers (7 all-reduces fused)"


def test_a_layer_with_its_own_forward_keeps_the_stock_contract(qwen35, monkeypatch):
    """The contract mirrors Qwen3NextDecoderLayer.forward: a subclass that overrides it must not stream."""
    from vllm.model_executor.models.qwen3_5 import Qwen3_5DecoderLayer

    core = find_core(qwen35)
    own = type("OwnForward", (Qwen3_5DecoderLayer,), {"forward": lambda self, *a, **k: None})
    monkeypatch.setattr(core.layers[1], "__class__", own)
    plan = plan_stream(core, 2, 1)
    assert not plan.layers[1].stream_mid and not plan.layers[1].stream_in
    assert "has its own forward" in plan.layers[1].reasons[0]


def test_the_text_models_tap_setter_replans(qwen35, caplog, monkeypatch):
    from radiance.fp8_stream import patch as patch_mod

    monkeypatch.setattr(patch_mod, "_parallel_sizes", lambda: (2, 1))
    caplog.set_level(logging.INFO, logger="radiance")
    core = find_core(qwen35)
    patch = Fp8StreamPatch()
    patch.apply()
    try:
        contract.install(core, plan_stream(core, 2, 1))
        qwen35.set_aux_hidden_state_layers((2, 3))  # what the runner does for a DFlash drafter
        done = contract.installed(core)
        assert done is not None and done.plan.taps == (2, 3), caplog.text
        assert [lp.defer_down for lp in done.plan.layers] == [True, False, False, False]
        assert core.layers[1].mlp.down_proj.reduce_results and core.layers[2].mlp.down_proj.reduce_results
    finally:
        patch.revert()
        contract.uninstall(core)
        qwen35.set_aux_hidden_state_layers(())
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForCausalLMBase

    assert not hasattr(Qwen3_5ForCausalLMBase, "_orig_set_aux_hidden_state_layers")


def test_the_vision_tower_is_never_quantised():
    from radiance.fp8_stream.linear import skipped

    assert skipped("visual.blocks.0.attn.qkv") and skipped("model.visual.merger.linear_fc1")
    assert not skipped("model.layers.0.mlp.gate_up_proj") and not skipped("model.layers.3.self_attn.qkv_proj")
