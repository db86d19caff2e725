"""The fused GDN gated-norm + quant epilogue (RADIANCE_GDN_NORM_QUANT) on real vLLM 0.32.0
Qwen3-Next GDN modules built on CPU under radiance_fp8 (the tiny model's shape: layers 0-2
GDN + dense MLP, layer 3 full attention + MoE; 4 value heads of 64 at TP=1)."""
from __future__ import annotations

import inspect
import logging

import pytest
import torch

pytest.importorskip("vllm")

from radiance import envs
from radiance.fp8_stream import contract, gdn
from radiance.fp8_stream.activation import Fp8Activation
from radiance.fp8_stream.patch import install_on
from radiance.fp8_stream.plan import FP8_INPUT_ATTR, Fp8Input, find_core, plan_stream
from radiance.kernels.fp8_common import quantize_reference
from radiance.kernels.gdn_norm_quant import gdn_norm_quant_reference

GDN_LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def model(shared_cache, tp1_group):
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    import radiance.fp8_stream.linear  # noqa: F401  (registers radiance_fp8)
    from tools import tinymodel

    path = str(tinymodel.ensure(shared_cache))
    mc = ModelConfig(model=path, dtype="bfloat16", enforce_eager=True,
                     hf_overrides={"mlp_only_layers": [0, 1, 2]}, quantization="radiance_fp8")
    vc = VllmConfig(model_config=mc)
    vc.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16):
        m = Qwen3NextForCausalLM(vllm_config=vc, prefix="")
    gen = torch.Generator().manual_seed(0)
    for i in GDN_LAYERS:
        la = m.model.layers[i].linear_attn
        la.norm.weight.data.copy_(1.0 + 0.2 * torch.randn(la.norm.weight.shape, generator=gen))
        out = la.out_proj
        out.weight.data.copy_(torch.randn(out.weight.shape, generator=gen) * 0.05)
        out.quant_method.process_weights_after_loading(out)
    return m


@pytest.fixture
def core(model):
    c = find_core(model)
    yield c
    contract.uninstall(c)


def gdn_inputs(la, t=7, seed=0):
    """core_attn_out [T, H, D] and a z sliced out of a wider tensor, as the GDN makes them."""
    g = torch.Generator().manual_seed(seed)
    h, d = la.num_v_heads // la.tp_size, la.head_v_dim
    core_attn_out = (torch.randn(t, h, d, generator=g) * 0.5).to(torch.bfloat16)
    wide = (torch.randn(t, 2 * h * d, generator=g) * 3.0).to(torch.bfloat16)
    return core_attn_out, wide[:, h * d:].view(t, h, d)


def stock_output_projection(la, core_attn_out, z):
    return type(la)._output_projection(la, core_attn_out, z)


def test_pinned_gdn_calls_output_projection_with_the_normed_pair():
    """Canary: the method bound here exists, and the CPU/CUDA forwards route through it."""
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import (
        QwenGatedDeltaNetAttention,
    )

    stock = inspect.getsource(QwenGatedDeltaNetAttention._output_projection)
    assert "self.norm(core_attn_out, z)" in stock and "self.out_proj(" in stock
    for fwd in (QwenGatedDeltaNetAttention.forward_cpu, QwenGatedDeltaNetAttention.forward_cuda):
        assert "self._output_projection(core_attn_out, z)" in inspect.getsource(fwd)


def test_knob_is_declared_and_off_by_default():
    assert envs.get(gdn.KNOB, {}) is False
    assert envs.get(gdn.KNOB, {gdn.KNOB: "1"}) is True


def test_every_gdn_layer_qualifies(core):
    for i in GDN_LAYERS:
        la = core.layers[i].linear_attn
        assert la.norm.activation == "silu" and la.norm.group_size is None and la.norm.norm_before_gate
        assert gdn.gdn_problem(la) is None


def test_knob_off_keeps_the_stock_method(core):
    done = contract.install(core, plan_stream(core, 2, 1))
    assert done.gdn == [] and done.gdn_refused == {}
    la = core.layers[0].linear_attn
    assert "_output_projection" not in vars(la)
    x, z = gdn_inputs(la)
    assert torch.equal(la._output_projection(x, z), stock_output_projection(la, x, z))


def test_install_binds_per_instance_and_uninstall_restores(core):
    done = contract.install(core, plan_stream(core, 2, 1), gdn_norm_quant=True)
    las = [core.layers[i].linear_attn for i in GDN_LAYERS]
    assert done.gdn == las and done.gdn_refused == {}
    assert all("_output_projection" in vars(la) for la in las)
    assert getattr(las[0], gdn.GDN_ATTR) == Fp8Input(0, torch.float8_e4m3fn)
    assert "3 gdn norm+quant epilogues" in done.summary()
    assert contract.uninstall(core)
    assert not any("_output_projection" in vars(la) or gdn.GDN_ATTR in vars(la) for la in las)


@pytest.mark.parametrize("group", [0, 128])
def test_fused_output_projection_is_the_kernel_into_out_proj(core, monkeypatch, group):
    """Bound method == the kernel's (q, scale) as an Fp8Activation into out_proj, bit for
    bit; against the stock method (norm, then out_proj's own quantiser) within the 1-ulp
    differences of the norm."""
    la = core.layers[1].linear_attn
    if group:  # what a block-fp8 out_proj declares
        monkeypatch.setattr(la.out_proj.quant_method, FP8_INPUT_ATTR, Fp8Input(128))
    contract.install(core, plan_stream(core, 2, 1), gdn_norm_quant=True)
    x, z = gdn_inputs(la, t=33, seed=group)
    got = la._output_projection(x, z)
    q, scale = gdn_norm_quant_reference(x.reshape(33, -1), z.reshape(33, -1), la.norm.weight,
                                        la.norm.eps, group)
    want, _ = la.out_proj(Fp8Activation(q, scale, torch.bfloat16))
    assert torch.equal(got, want)
    if group == 0:
        stock = stock_output_projection(la, x, z)
        normed = la.norm(x, z).reshape(33, -1)
        sq, ss = quantize_reference(normed, 0, torch.float8_e4m3fn)
        if torch.equal(sq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(ss, scale):
            assert torch.equal(got, stock)  # the same (q, scale) -> the same GEMM output
        torch.testing.assert_close(got.float(), stock.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("attr,value,needle", [
    ("activation", "sigmoid", "activation 'sigmoid'"),
    ("group_size", 32, "group_size=32"),
    ("norm_before_gate", False, "norm_before_gate=False"),
])
def test_norm_guards_keep_the_layer_stock(core, monkeypatch, attr, value, needle):
    monkeypatch.setattr(core.layers[1].linear_attn.norm, attr, value)
    done = contract.install(core, plan_stream(core, 2, 1), gdn_norm_quant=True)
    assert len(done.gdn) == 2 and "_output_projection" not in vars(core.layers[1].linear_attn)
    (why, idx), = done.gdn_refused.items()
    assert idx == [1] and needle in why and needle in done.summary()


def test_out_proj_guards(core, monkeypatch):
    las = [core.layers[i].linear_attn for i in GDN_LAYERS]
    monkeypatch.setattr(las[0].out_proj.quant_method, FP8_INPUT_ATTR, None)
    monkeypatch.setattr(las[1].out_proj.quant_method, FP8_INPUT_ATTR, Fp8Input(128))
    monkeypatch.setattr(las[1].out_proj, "input_size_per_partition", 192)
    monkeypatch.setattr(las[2], "enable_fused_gdn_spec_decode", True)
    assert "takes no pre-quantised input" in gdn.gdn_problem(las[0])
    assert "not a multiple of its group 128" in gdn.gdn_problem(las[1])
    assert "spec-decode" in gdn.gdn_problem(las[2])


def test_weight_guards(core, monkeypatch):
    la = core.layers[0].linear_attn
    monkeypatch.setattr(la.norm, "weight", torch.nn.Parameter(la.norm.weight.float()))
    assert "dtype torch.float32" in gdn.gdn_problem(la)
    monkeypatch.setattr(la, "head_v_dim", 48)
    assert "head_v_dim 48" in gdn.gdn_problem(la)


def test_install_line_counts_and_says_why_once(model, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="radiance")
    core = find_core(model)
    monkeypatch.setenv(gdn.KNOB, "1")
    for i in (0, 2):
        monkeypatch.setattr(core.layers[i].linear_attn.norm, "activation", "sigmoid")
    try:
        line = install_on(model, sizes=(2, 1))
    finally:
        contract.uninstall(core)
    assert "1 gdn norm+quant epilogues" in line
    assert line.count("activation 'sigmoid'") == 1 and "layers 0,2:" in line
    assert [r.getMessage() for r in caplog.records] == [f"radiance: {line}"]
    monkeypatch.setenv(gdn.KNOB, "0")
    try:
        assert "gdn" not in install_on(model, sizes=(2, 1))
    finally:
        contract.uninstall(core)
