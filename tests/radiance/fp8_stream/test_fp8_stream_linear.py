"""The radiance_fp8 linear method (online W8A8, takes a tensor or an Fp8Activation), its
registration with vLLM, the carrier, and how often the epilogue's norm differs from vLLM's."""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("vllm")

from radiance.fp8_stream.activation import Fp8Activation
from radiance.fp8_stream.linear import (
    QUANT_NAME,
    Fp8StreamConfig,
    Fp8StreamLinearMethod,
)
from radiance.fp8_stream.plan import Fp8Input, fp8_input_of
from radiance.kernels.add_rms_quant import add_rms_norm_reference, add_rms_quant_reference
from radiance.kernels.fp8_common import FP8_MAX, quantize_reference

FN = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def make_linear(tp1_group):
    """make_linear(kind, k, n) -> a real vLLM linear under radiance_fp8, random bf16 weights
    loaded through its own weight loader, then processed (quantised)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )

    def make(kind: str, k: int = 256, n: int = 192, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        cfg = Fp8StreamConfig()
        with set_current_vllm_config(VllmConfig()):
            if kind == "merged":
                layer = MergedColumnParallelLinear(k, [n // 2, n // 2], bias=False, quant_config=cfg,
                                                   params_dtype=torch.bfloat16, prefix="mlp.gate_up_proj")
            elif kind == "qkv":
                layer = QKVParallelLinear(k, 32, 4, 2, bias=False, quant_config=cfg,
                                          params_dtype=torch.bfloat16, prefix="self_attn.qkv_proj")
            else:
                layer = RowParallelLinear(k, n, bias=False, quant_config=cfg,
                                          params_dtype=torch.bfloat16, prefix="mlp.down_proj")
        w = (torch.randn(layer.weight.shape, generator=gen) * 0.05).to(torch.bfloat16)
        layer.weight.data.copy_(w)
        layer.quant_method.process_weights_after_loading(layer)
        return layer, w

    return make


# --- the method --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["merged", "qkv", "row"])
def test_weights_are_fp8_per_output_channel(make_linear, kind):
    layer, w = make_linear(kind)
    assert isinstance(layer.quant_method, Fp8StreamLinearMethod)
    assert layer.weight.dtype == FN and layer.weight.shape == w.shape
    assert layer.weight_scale.shape == (w.shape[0], 1) and layer.weight_scale.dtype == torch.float32
    amax = w.float().abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(layer.weight_scale, amax / FP8_MAX[FN], rtol=1e-6, atol=0)
    deq = layer.weight.float() * layer.weight_scale
    # e4m3: 3 mantissa bits, relative error <= 2^-4 of the value (more below the normals)
    assert ((deq - w.float()).abs() <= w.float().abs() / 16 + layer.weight_scale / 8).all()
    assert fp8_input_of(layer) == Fp8Input(0, FN)


@pytest.mark.parametrize("kind", ["merged", "qkv", "row"])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_tensor_and_carrier_inputs_give_identical_outputs(make_linear, kind, m):
    layer, w = make_linear(kind)
    x = torch.randn(m, w.shape[1]).to(torch.bfloat16)
    q, scale = quantize_reference(x, 0, FN)
    out_tensor, _ = layer(x)
    out_carrier, _ = layer(Fp8Activation(q, scale, torch.bfloat16))
    assert out_tensor.dtype == out_carrier.dtype == torch.bfloat16
    assert out_tensor.shape == (m, w.shape[0])
    assert torch.equal(out_tensor, out_carrier)
    # and it is the W8A8 product (fp32 accumulation) of the quantised operands
    ref = ((q.float() * scale) @ (layer.weight.float() * layer.weight_scale).t()).to(torch.bfloat16)
    torch.testing.assert_close(out_tensor, ref, atol=1e-2, rtol=1e-2)


def test_epilogue_output_equals_stock_norm_then_quantising_linear(make_linear):
    """What the contract hands the consumer vs what the stock path would: same codes, same
    output, whenever the normed rows agree (the norm numerics are measured below)."""
    layer, _ = make_linear("merged")
    torch.manual_seed(1)
    y, r = torch.randn(16, 256).to(torch.bfloat16), torch.randn(16, 256).to(torch.bfloat16)
    weight = (torch.randn(256) * 0.1).to(torch.bfloat16)
    q, scale, _ = add_rms_quant_reference(y, r, weight, 1e-6, 0, FN)
    normed, _ = add_rms_norm_reference(y, r, weight, 1e-6)
    assert torch.equal(layer(normed)[0], layer(Fp8Activation(q, scale, torch.bfloat16))[0])


def test_leading_dims_are_kept(make_linear):
    layer, w = make_linear("merged")
    x = torch.randn(2, 3, w.shape[1]).to(torch.bfloat16)
    assert layer(x)[0].shape == (2, 3, w.shape[0])


def test_skips_router_gates_lm_head_and_non_linears(tp1_group):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.linear import (
        ReplicatedLinear,
        UnquantizedLinearMethod,
    )

    cfg = Fp8StreamConfig()
    with set_current_vllm_config(VllmConfig()):
        gate = GateLinear(256, 4, prefix="model.layers.0.mlp.gate")
        shared_gate = ReplicatedLinear(256, 1, bias=False, prefix="model.layers.0.mlp.shared_expert_gate")
        fc = ReplicatedLinear(512, 256, bias=False, prefix="mtp.fc")
    assert isinstance(cfg.get_quant_method(gate, gate.prefix), UnquantizedLinearMethod)
    assert isinstance(cfg.get_quant_method(shared_gate, shared_gate.prefix), UnquantizedLinearMethod)
    assert isinstance(cfg.get_quant_method(fc, "mtp.fc"), Fp8StreamLinearMethod)
    assert cfg.get_quant_method(torch.nn.Embedding(4, 4), "model.embed_tokens") is None


# --- registration ------------------------------------------------------------------------

def test_registered_with_vllm_by_name():
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        get_quantization_config,
    )

    assert QUANT_NAME in QUANTIZATION_METHODS
    assert get_quantization_config(QUANT_NAME) is Fp8StreamConfig
    assert Fp8StreamConfig.get_config_filenames() == []  # bf16 checkpoints: nothing to read
    assert torch.bfloat16 in Fp8StreamConfig.get_supported_act_dtypes()


def test_plugin_registration_failure_is_one_line_not_a_crash(monkeypatch, caplog):
    from radiance import plugin

    monkeypatch.setattr(plugin, "QUANT_MODULES", ("radiance.no_such_quant_module",))
    caplog.set_level(logging.WARNING, logger="radiance")
    plugin.register_quantization()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "radiance.no_such_quant_module not registered" in lines[0]


# --- the carrier -------------------------------------------------------------------------

def test_carrier_answers_like_the_activation():
    q = torch.zeros(5, 256, dtype=FN)
    act = Fp8Activation(q, torch.ones(5, 1), torch.bfloat16)
    assert act.size(0) == 5 and act.size(-1) == 256 and act.size() == q.size()
    assert act.shape == (5, 256) and act.dtype == torch.bfloat16 and act.device == q.device
    assert act.dim() == act.ndim == 2


def test_carrier_through_the_method_traces_in_one_graph(make_linear):
    """torch.compile (fullgraph) of the consumer side: carrier built, read like a tensor, fed
    to the method, custom op inside."""
    layer, w = make_linear("merged")

    def consume(q, scale):
        act = Fp8Activation(q, scale, torch.bfloat16)
        out = layer.quant_method.apply(layer, act)
        return out.view(act.size(0), -1).to(act.dtype)

    x = torch.randn(4, w.shape[1]).to(torch.bfloat16)
    q, scale = quantize_reference(x, 0, FN)
    compiled = torch.compile(consume, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, scale), consume(q, scale))


# --- measured: our norm vs vLLM's native GemmaRMSNorm ------------------------------------

def test_measure_norm_and_code_mismatch_against_vllm_native_norm(capsys):
    """Measured, not asserted equal: add_rms_quant sums squares order-free and exactly; vLLM's
    native fused_add_rms_norm (what runs on CPU) takes torch's fp32 mean. Rows whose normed
    bf16 output differs by an ulp are rare, rows whose fp8 codes differ rarer still."""
    from vllm.ir.ops.layernorm import fused_add_rms_norm

    native = fused_add_rms_norm.impls["native"].impl_fn  # GemmaRMSNorm's path on CPU
    rows, k, eps = 60_000, 256, 1e-6
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    r = (torch.randn(rows, k, generator=gen) * 3).to(torch.bfloat16)
    w = (torch.randn(k, generator=gen) * 0.1).to(torch.bfloat16)
    stock, stock_res = native(y, r, w.float() + 1.0, eps)
    ours, ours_res = add_rms_norm_reference(y, r, w, eps)
    assert torch.equal(stock_res, ours_res)  # the residual never depends on the variance
    diff_rows = (stock != ours).any(dim=1)
    ulps = (stock.float() - ours.float()).abs() / _bf16_ulp(stock.float())
    q_stock, s_stock = quantize_reference(stock, 0, FN)
    q_ours, s_ours = quantize_reference(ours, 0, FN)
    code_rows = (q_stock.view(torch.uint8) != q_ours.view(torch.uint8)).any(dim=1) | (s_stock != s_ours).any(dim=1)
    with capsys.disabled():
        print(f"\n[fp8-stream] K={k}, {rows} rows: normed bf16 rows differing "
              f"{int(diff_rows.sum())} (1 in {rows / max(1, int(diff_rows.sum())):.0f}), "
              f"max {float(ulps.max()):.0f} ulp; fp8 code/scale rows differing {int(code_rows.sum())} "
              f"(1 in {rows / max(1, int(code_rows.sum())):.0f})")
    assert float(ulps.max()) <= 1.0


def _bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0 ** -126)))
    return torch.exp2(e - 7)
