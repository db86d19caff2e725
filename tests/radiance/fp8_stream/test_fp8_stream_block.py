"""radiance_fp8 on a block-fp8 checkpoint: vLLM hands the checkpoint to it, the linears load
the file's e4m3 weights and 128x128 inverse scales as stored, take a tensor or a group-128
Fp8Activation with identical results, and the plan streams the dense / GDN / full-attention
sites with Fp8Input(128). The checkpoint is the tiny generator's ``fp8_blocks`` variant,
written into tmp (layers 0-2 dense with GDN attention, layer 3 MoE with full attention)."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

pytest.importorskip("vllm")

from tools.tinymodel import config as tiny_config
from tools.tinymodel import fp8 as tiny_fp8
from radiance.fp8_stream import block
from radiance.fp8_stream.activation import Fp8Activation
from radiance.fp8_stream.block import (
    BlockFp8StreamLinearMethod,
    Fp8StreamBlockConfig,
    KeptLinearMethod,
)
from radiance.fp8_stream.linear import QUANT_NAME, Fp8StreamConfig
from radiance.fp8_stream.plan import FP8_INPUT_ATTR, Fp8Input, find_core, plan_stream
from radiance.kernels.add_rms_quant import add_rms_norm_reference, add_rms_quant
from radiance.w4.convert import dequant_block_fp8

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
GROUP_128 = Fp8Input(128, FN)
DENSE = (0, 1, 2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from tools.tinymodel import generate_into

    return generate_into(tmp_path_factory.mktemp("fp8blk") / "m", seed=0, mlp_only_layers=DENSE,
                         embed_scale=16.0, norm_std=0.1, fp8_blocks=True)


@pytest.fixture(scope="module")
def state(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


def _vllm_config(path, quantization=QUANT_NAME):
    from vllm.config import ModelConfig, VllmConfig

    mc = ModelConfig(model=str(path), dtype="bfloat16", enforce_eager=True, quantization=quantization)
    return VllmConfig(model_config=mc)


@pytest.fixture(scope="module")
def model(ckpt, tp1_group):
    """The CausalLM built under the checkpoint's config, loaded from the file and processed, as
    vLLM's loader does (TP=1: the TP=2 shards are the e2e's)."""
    from safetensors.torch import safe_open
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import (
        configure_quant_config,
        process_weights_after_loading,
    )
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    vc = _vllm_config(ckpt)
    vc.compilation_config.static_forward_context.clear()
    configure_quant_config(vc.quant_config, Qwen3NextForCausalLM)  # as initialize_model does
    with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16):
        m = Qwen3NextForCausalLM(vllm_config=vc, prefix="")
        with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
            m.load_weights((name, f.get_tensor(name)) for name in f.keys())  # noqa: SIM118 (safe_open is not iterable)
        process_weights_after_loading(m, vc.model_config, torch.device("cpu"))
    return m


# --- vLLM resolves --quantization radiance_fp8 on the checkpoint to the block mode -------

def test_override_takes_the_block_fp8_checkpoint(ckpt, tp1_group):
    vc = _vllm_config(ckpt)
    assert vc.model_config.quantization == QUANT_NAME
    assert isinstance(vc.quant_config, Fp8StreamBlockConfig)
    assert "model.layers.0.linear_attn.in_proj_ba" in vc.quant_config.ignored_layers
    hf = json.loads((ckpt / "config.json").read_text())["quantization_config"]
    assert Fp8StreamConfig.override_quantization_method(hf, None) is None  # no flag: stock fp8
    assert Fp8StreamConfig.override_quantization_method({"quant_method": "awq"}, QUANT_NAME) is None


@pytest.mark.parametrize("change, words", [
    ({"activation_scheme": "static"}, "activation_scheme 'static'"),
    ({"weight_block_size": [64, 64]}, "weight_block_size [64, 64]"),
    ({"weight_block_size": None}, "no weight_block_size"),
    ({"fmt": "e5m2"}, "fmt 'e5m2'"),
])
def test_other_fp8_checkpoints_are_refused_naming_the_field(ckpt, tmp_path, change, words):
    other = tmp_path / "m"
    shutil.copytree(ckpt, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["quantization_config"].update(change)
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=re.escape(f"radiance_fp8 cannot serve this fp8 checkpoint: {words}")):
        _vllm_config(other)


# --- methods and loaded weights ----------------------------------------------------------

def _methods(model):
    from vllm.model_executor.layers.linear import LinearBase

    return {name: type(mod.quant_method) for name, mod in model.named_modules()
            if isinstance(mod, LinearBase) and not name.endswith(".conv1d")}


def test_each_linear_gets_the_method_its_checkpoint_entry_asks_for(model):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    kinds = _methods(model)
    kept = {n for n, k in kinds.items() if k is KeptLinearMethod}
    plain = {n for n, k in kinds.items() if k is UnquantizedLinearMethod}
    assert kept == {f"model.layers.{i}.linear_attn.in_proj_ba" for i in DENSE} | {"model.layers.3.self_attn.qkv_proj"}
    assert plain == {"model.layers.3.mlp.gate", "model.layers.3.mlp.shared_expert_gate"}
    assert all(k is BlockFp8StreamLinearMethod for n, k in kinds.items() if n not in kept | plain)
    assert kinds["model.layers.0.mlp.gate_up_proj"] is BlockFp8StreamLinearMethod
    assert kinds["model.layers.3.mlp.shared_expert.down_proj"] is BlockFp8StreamLinearMethod
    experts = [type(m.quant_method).__name__ for m in model.model.layers[3].mlp.experts.modules()
               if "MoE" in type(getattr(m, "quant_method", None)).__name__]
    assert experts == ["UnquantizedFusedMoEMethod"]  # listed unconverted: Fp8Config's answer


def _layer(model, name):
    return dict(model.named_modules())[name]


@pytest.mark.parametrize("name, parts", [
    ("model.layers.0.mlp.gate_up_proj", ("gate_proj", "up_proj")),
    ("model.layers.1.linear_attn.in_proj_qkvz", ("in_proj_qkvz",)),
    ("model.layers.2.mlp.down_proj", ("down_proj",)),
    ("model.layers.3.self_attn.o_proj", ("o_proj",)),
])
def test_loaded_block_weights_are_the_checkpoints(model, state, name, parts):
    layer = _layer(model, name)
    parent = name.rpartition(".")[0]
    want_w = torch.cat([state[f"{parent}.{p}.weight"] for p in parts])
    want_s = torch.cat([state[f"{parent}.{p}.weight_scale_inv"] for p in parts])
    assert layer.weight.dtype == FN and layer.weight.shape == want_w.shape  # [N, K], no transpose
    assert torch.equal(layer.weight.view(torch.uint8), want_w.view(torch.uint8))
    assert torch.equal(layer.weight_scale_inv, want_s)
    assert layer.quant_method.fp8_input == GROUP_128


def test_kept_consumers_load_their_bf16_weights_untouched(model, state):
    ba = _layer(model, "model.layers.0.linear_attn.in_proj_ba")
    assert torch.equal(ba.weight, state["model.layers.0.linear_attn.in_proj_ba.weight"])
    qkv = _layer(model, "model.layers.3.self_attn.qkv_proj")
    want = torch.cat([state[f"model.layers.3.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
    assert torch.equal(qkv.weight, want)
    assert ba.quant_method.fp8_input == qkv.quant_method.fp8_input == GROUP_128


# --- apply: a tensor and the epilogue's Fp8Activation give the same output ---------------

CONSUMERS = [  # (consumer, the norm whose output it reads)
    ("model.layers.0.mlp.gate_up_proj", "model.layers.0.post_attention_layernorm"),
    ("model.layers.1.linear_attn.in_proj_qkvz", "model.layers.1.input_layernorm"),
    ("model.layers.1.linear_attn.in_proj_ba", "model.layers.1.input_layernorm"),
    ("model.layers.3.self_attn.qkv_proj", "model.layers.3.input_layernorm"),
]


@pytest.mark.parametrize("name, norm", CONSUMERS)
@pytest.mark.parametrize("m", [1, 7, 64])
def test_tensor_and_group128_epilogue_activation_are_bit_identical(model, name, norm, m):
    layer, norm = _layer(model, name), _layer(model, norm)
    gen = torch.Generator().manual_seed(m)
    y = torch.randn(m, tiny_config.HIDDEN, generator=gen).to(torch.bfloat16)
    r = (torch.randn(m, tiny_config.HIDDEN, generator=gen) * 4).to(torch.bfloat16)
    eps = norm.variance_epsilon
    q, scale, _ = add_rms_quant(y, r, norm.weight, eps, 128, FN)
    assert scale.shape == (m, tiny_config.HIDDEN // 128)
    normed, _ = add_rms_norm_reference(y, r, norm.weight, eps)
    out_tensor, _ = layer(normed)
    out_carrier, _ = layer(Fp8Activation(q, scale, torch.bfloat16))
    assert out_tensor.dtype == out_carrier.dtype == torch.bfloat16
    assert torch.equal(out_tensor, out_carrier)
    # ... and it is the product of the dequantised operands (the checkpoint's blocks)
    a = (q.float().view(m, -1, 128) * scale.unsqueeze(-1)).view(m, -1)
    w = layer.weight.float() if layer.weight.dtype == torch.bfloat16 else \
        dequant_block_fp8(layer.weight, layer.weight_scale_inv, (128, 128), torch.float32)
    torch.testing.assert_close(out_tensor.float(), a @ w.t(), atol=2e-2, rtol=2e-2)


def test_leading_dims_are_kept(model):
    layer = _layer(model, "model.layers.0.mlp.gate_up_proj")
    assert layer(torch.randn(2, 3, tiny_config.HIDDEN).to(torch.bfloat16))[0].shape == (2, 3, 1024)


@pytest.mark.parametrize("name", ["model.layers.1.linear_attn.in_proj_qkvz", "model.layers.1.linear_attn.in_proj_ba"])
def test_carrier_through_the_methods_traces_in_one_graph(model, name):
    layer = _layer(model, name)

    def consume(q, scale):
        return layer.quant_method.apply(layer, Fp8Activation(q, scale, torch.bfloat16))

    from radiance.kernels.fp8_common import quantize_reference

    q, scale = quantize_reference(torch.randn(4, tiny_config.HIDDEN).to(torch.bfloat16), 128, FN)
    compiled = torch.compile(consume, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, scale), consume(q, scale))


# --- the plan ----------------------------------------------------------------------------

def test_plan_streams_dense_gdn_and_full_attention_sites_with_group_128(model):
    plan = plan_stream(find_core(model), 2, 1)
    assert plan.declined is None
    assert [lp.stream_mid for lp in plan.layers] == [True, True, True, False]   # layer 3: MoE
    assert [lp.stream_in for lp in plan.layers] == [False, True, True, True]    # 3: full attention
    assert {lp.in_format for lp in plan.layers if lp.stream_in} == {GROUP_128}
    assert {lp.mid_format for lp in plan.layers if lp.stream_mid} == {GROUP_128}
    assert plan.summary().startswith("3 input + 3 post-attention epilogues over 4 layers")


@pytest.mark.parametrize("fmt", [Fp8Input(128, FNUZ), Fp8Input(0, FN)], ids=["fnuz", "per-token"])
def test_gdn_consumers_in_different_fp8_formats_decline_the_site(model, monkeypatch, fmt):
    """in_proj_qkvz (block fp8) and in_proj_ba (kept bf16) read one epilogue: one format or none."""
    ba = _layer(model, "model.layers.1.linear_attn.in_proj_ba")
    monkeypatch.setattr(ba.quant_method, FP8_INPUT_ATTR, fmt)
    plan = plan_stream(find_core(model), 2, 1)
    assert not plan.layers[1].stream_in and not plan.layers[0].defer_down
    assert "layer 1 input: consumers disagree on the fp8 format" in plan.layers[0].reasons[0]
    assert plan.layers[2].stream_in  # the other sites keep streaming


def test_an_activation_in_the_wrong_fp8_dtype_is_refused(model):
    layer = _layer(model, "model.layers.0.mlp.gate_up_proj")
    q = torch.zeros(2, tiny_config.HIDDEN, dtype=FNUZ)
    with pytest.raises(ValueError, match="takes torch.float8_e4m3fn"):
        layer(Fp8Activation(q, torch.ones(2, 2), torch.bfloat16))


# --- e4m3fnuz devices: vLLM's normalisation rule -----------------------------------------

def _block_linear(cfg, prefix="model.layers.0.mlp.gate_up_proj"):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    with set_current_vllm_config(VllmConfig()):
        return MergedColumnParallelLinear(256, [256, 128], bias=False, quant_config=cfg,
                                          params_dtype=torch.bfloat16, prefix=prefix)


def test_fnuz_device_normalises_the_checkpoint_weights(tp1_group, monkeypatch):
    monkeypatch.setattr(block, "fp8_dtype_for_device", lambda device=None: FNUZ)
    cfg = Fp8StreamBlockConfig.from_checkpoint(tiny_fp8.quantization_config([]))
    layer = _block_linear(cfg)
    gen = torch.Generator().manual_seed(0)
    shards = [torch.randn(n, 256, generator=gen) * 0.05 for n in (256, 128)]
    shards[0][0, :8] = -0.0  # e4m3fn 0x80, NaN as fnuz
    for i, w in enumerate(shards):
        q, s = tiny_fp8.quantize_blocks(w)
        layer.weight_loader_v2(layer.weight, q, i)
        layer.weight_loader_v2(layer.weight_scale_inv, s, i)
    fn_w, fn_s = layer.weight.data.clone(), layer.weight_scale_inv.data.clone()
    assert (fn_w.view(torch.uint8) == 0x80).any()
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.weight.dtype == FNUZ and torch.equal(layer.weight_scale_inv, fn_s * 2)
    assert not torch.isnan(layer.weight.float()).any()
    deq = dequant_block_fp8(layer.weight, layer.weight_scale_inv, (128, 128), torch.float32)
    torch.testing.assert_close(deq, dequant_block_fp8(fn_w, fn_s, (128, 128), torch.float32), rtol=0, atol=0)
    assert layer.quant_method.fp8_input == Fp8Input(128, FNUZ)
    x = torch.randn(3, 256).to(torch.bfloat16)
    from radiance.kernels.fp8_common import quantize_reference

    q, scale = quantize_reference(x, 128, FNUZ)
    assert torch.equal(layer(x)[0], layer(Fp8Activation(q, scale, torch.bfloat16))[0])


def test_kept_consumer_without_whole_k_groups_declares_nothing(tp1_group):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    cfg = Fp8StreamBlockConfig.from_checkpoint(
        tiny_fp8.quantization_config(["model.layers.0.linear_attn.in_proj_ba"]))
    with set_current_vllm_config(VllmConfig()):
        layer = MergedColumnParallelLinear(200, [8], bias=False, quant_config=cfg, params_dtype=torch.bfloat16,
                                           prefix="model.layers.0.linear_attn.in_proj_ba")
    assert isinstance(layer.quant_method, KeptLinearMethod) and layer.quant_method.fp8_input is None
    layer.weight.data.normal_()
    x = torch.randn(2, 200).to(torch.bfloat16)
    assert torch.equal(layer(x)[0], torch.nn.functional.linear(x, layer.weight))


# --- the generator's block format --------------------------------------------------------

def test_generator_blocks_round_trip_with_partial_blocks():
    w = torch.randn(200, 300) * 0.03
    q, s = tiny_fp8.quantize_blocks(w)
    assert q.dtype == FN and q.shape == (200, 300) and s.shape == (2, 3)
    deq = (q.float() * s.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300])
    assert ((deq - w).abs() <= w.abs() / 16 + s.max() / 8).all()


def test_generator_keeps_what_a_tp2_server_cannot_block():
    converted, kept = tiny_fp8.converted_modules(tiny_config.tensor_layout(DENSE))
    assert "model.layers.0.linear_attn.in_proj_qkvz" in converted and "model.layers.2.mlp.up_proj" in converted
    for name in ("model.layers.0.linear_attn.in_proj_ba", "model.layers.3.self_attn.q_proj",
                 "model.layers.3.self_attn.k_proj", "model.layers.3.mlp.gate", "model.layers.3.mlp.experts",
                 "model.layers.3.mlp.shared_expert_gate", "lm_head"):
        assert name in kept, name
