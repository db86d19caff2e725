"""w4-drafter against real vLLM 0.32 layers on CPU: what is converted inside the drafter's
load and only there, what is declined and said so, block-fp8 checkpoints, fail-closed."""
from __future__ import annotations

import logging
import types

import pytest
import torch

from radiance import patching
from radiance.kernels import w4a16_gemm as wk
from radiance.w4 import convert
from radiance.w4.patch_drafter import PATCHES, W4DrafterPatch
from radiance.w4.scope import DRAFT_SCOPE


def _linears():
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )

    bf = torch.bfloat16
    layers = {
        "qkv": QKVParallelLinear(256, 64, 4, 2, bias=False, params_dtype=bf, disable_tp=True,
                                 prefix="mtp.layers.0.self_attn.qkv_proj"),
        "o": RowParallelLinear(256, 256, bias=True, params_dtype=bf, disable_tp=True,
                               prefix="mtp.layers.0.self_attn.o_proj"),
        "gate_up": MergedColumnParallelLinear(256, [384, 384], bias=False, params_dtype=bf, disable_tp=True,
                                              prefix="mtp.layers.0.mlp.shared_expert.gate_up_proj"),
        "fc": ColumnParallelLinear(512, 256, bias=False, params_dtype=bf, disable_tp=True, prefix="mtp.fc"),
        "router": ReplicatedLinear(256, 32, bias=False, params_dtype=bf, prefix="mtp.layers.0.mlp.gate"),
        "odd_k": ReplicatedLinear(200, 256, bias=False, params_dtype=bf, prefix="mtp.layers.0.odd"),
    }
    gen = torch.Generator().manual_seed(0)
    for layer in layers.values():
        layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.02)
        if getattr(layer, "bias", None) is not None:
            layer.bias.data.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.1)
    return layers


def _load_draft(layers):
    """What vLLM's loader does for each module, inside the (patched) drafter _get_model."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    proposer = SpecDecodeBaseProposer.__new__(SpecDecodeBaseProposer)  # vLLM's class, without its engine
    proposer.layers = list(layers)
    return proposer._get_model()


@pytest.fixture
def w4(vllm_cpu, monkeypatch):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    def fake_get_model(proposer):
        for layer in proposer.layers:
            layer.quant_method.process_weights_after_loading(layer)
        return proposer.layers

    monkeypatch.setattr(SpecDecodeBaseProposer, "_get_model", fake_get_model)
    monkeypatch.setenv("RADIANCE_W4_DRAFTER", "1")
    monkeypatch.delenv("RADIANCE_W4_GROUP_SIZE", raising=False)
    patch = W4DrafterPatch()
    version = vllm_cpu.__version__
    assert DRAFT_SCOPE.install(version).status == "applied"
    out = patch.install(version)
    assert out.status == "applied", out.reason
    yield patch
    patch.revert()
    DRAFT_SCOPE.revert()


def test_the_drafter_load_bracket_installs_first():
    assert PATCHES[0] is DRAFT_SCOPE


def test_drafter_linears_converted_others_declined(w4, caplog):
    layers = _linears()
    wants = {name: layer.weight.detach().float().clone() for name, layer in layers.items()}
    with caplog.at_level(logging.INFO, logger="radiance"):
        _load_draft(layers.values())
    for name in ("qkv", "o", "gate_up"):
        layer = layers[name]
        assert isinstance(layer.quant_method, convert.W4Method), name
        assert layer.weight.numel() == 0 and layer.w4_qweight.dtype == torch.int32
        x = torch.randn(3, 256).to(torch.bfloat16)
        got = layer(x)
        got = got[0] if isinstance(got, tuple) else got
        bias = layer.bias if name == "o" else None
        want = wk.w4a16_gemm_reference(x, layer.w4_qweight, layer.w4_scales, 128)
        if bias is not None:
            want = want + bias
        torch.testing.assert_close(got, want)
        exact = x.float() @ wants[name].t() + (bias.float() if bias is not None else 0)
        assert float((got.float() - exact).norm() / exact.norm()) < 0.15
    for name in ("fc", "router", "odd_k"):
        assert not isinstance(layers[name].quant_method, convert.W4Method), name
    text = caplog.text
    assert "declined: fc" in text and "declined: gate MoE router" in text and "not a multiple" in text
    assert "bf16 512x256 mtp.layers.0.self_attn.qkv_proj: converted" in text
    assert "w4-drafter converted 3 drafter linears" in text


def test_layers_loaded_outside_the_drafter_bracket_are_untouched(w4):
    layers = _linears()
    for layer in layers.values():
        layer.quant_method.process_weights_after_loading(layer)  # the target's load
    assert not any(isinstance(layer.quant_method, convert.W4Method) for layer in layers.values())
    assert w4.converted_total == 0


def test_drafter_without_convertible_linears_declines(w4):
    layers = _linears()
    _load_draft([layers["fc"], layers["router"]])
    out = patching.report().outcomes[w4.name]
    assert out.status == "declined" and "no convertible linears" in out.reason


def test_block_fp8_checkpoint_is_dequantised_with_its_own_blocks(w4):
    from vllm.model_executor.layers.linear import RowParallelLinear
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod

    layer = RowParallelLinear(256, 384, bias=False, params_dtype=torch.bfloat16, disable_tp=True,
                              prefix="mtp.layers.0.self_attn.o_proj")
    w = torch.randn(384, 256) * 0.02
    scale = torch.rand(3, 2) + 0.5          # [ceil(384/128), ceil(256/128)]
    w8 = (w / scale.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
    layer.weight = torch.nn.Parameter(w8, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(scale, requires_grad=False)
    layer.orig_dtype = torch.bfloat16
    method = Fp8LinearMethod.__new__(Fp8LinearMethod)  # vLLM's class, without the quant config it needs
    method.block_quant, method.weight_block_size = True, [128, 128]
    calls = []
    with DRAFT_SCOPE.entered():
        method.process_weights_after_loading(layer)
    assert not calls and isinstance(layer.quant_method, convert.W4Method)
    assert layer.weight.numel() == 0 and layer.weight_scale_inv.numel() == 0
    deq = convert.dequant_block_fp8(w8, scale, (128, 128), torch.float32)
    x = torch.randn(2, 256).to(torch.bfloat16)
    got = layer.quant_method.apply(layer, x).float()
    exact = x.float() @ deq.t()
    assert float((got - exact).norm() / exact.norm()) < 0.15


def test_conversion_error_fails_closed_to_stock(w4, monkeypatch):
    monkeypatch.setattr(convert, "quantize_weight", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    layers = _linears()
    _load_draft([layers["qkv"]])
    assert w4.latched_off and "boom" in w4.latch_reason
    assert not isinstance(layers["qkv"].quant_method, convert.W4Method)
    assert hasattr(layers["qkv"], "cpu_linear")  # the stock CPU processing ran
    _load_draft([layers["o"]])                    # and keeps running once latched
    assert not isinstance(layers["o"].quant_method, convert.W4Method)


def test_failed_kernel_self_check_converts_nothing(w4, monkeypatch):
    monkeypatch.setattr(convert, "kernel_self_check", lambda *a: "kernel broken")
    layers = _linears()
    _load_draft(layers.values())
    assert w4.latched_off and w4.latch_reason == "kernel broken"
    assert not any(isinstance(layer.quant_method, convert.W4Method) for layer in layers.values())


def test_knob_off_and_bad_group_size(vllm_cpu, monkeypatch):
    monkeypatch.setenv("RADIANCE_W4_DRAFTER", "0")
    assert W4DrafterPatch().install(vllm_cpu.__version__).status == "disabled"
    monkeypatch.setenv("RADIANCE_W4_DRAFTER", "1")
    monkeypatch.setenv("RADIANCE_W4_GROUP_SIZE", "48")
    DRAFT_SCOPE.install(vllm_cpu.__version__)
    try:
        out = W4DrafterPatch().install(vllm_cpu.__version__)
        assert out.status == "declined" and "RADIANCE_W4_GROUP_SIZE=48" in out.reason
    finally:
        DRAFT_SCOPE.revert()
    assert W4DrafterPatch().install(vllm_cpu.__version__).status == "declined"  # no bracket


def test_converted_layer_traces_without_graph_breaks(w4):
    """vLLM compiles the model with fullgraph Dynamo: the 4-bit apply must trace."""
    layers = _linears()
    _load_draft([layers["qkv"], layers["o"]])
    x = torch.randn(4, 256).to(torch.bfloat16)
    for name in ("qkv", "o"):
        layer = layers[name]
        eager = layer(x)
        compiled = torch.compile(layer.forward, backend="eager", fullgraph=True)(x)
        eager = eager[0] if isinstance(eager, tuple) else eager
        compiled = compiled[0] if isinstance(compiled, tuple) else compiled
        assert torch.equal(compiled, eager), name


def test_both_features_share_one_bracket(vllm_cpu, monkeypatch):
    from radiance.lmhead_int4.patch import PATCHES as HEAD_PATCHES

    monkeypatch.setenv("RADIANCE_W4_DRAFTER", "1")
    monkeypatch.setenv("RADIANCE_INT4_HEAD", "1")
    assert HEAD_PATCHES[0] is PATCHES[0] is DRAFT_SCOPE
    registry = patching.Registry([*PATCHES, *HEAD_PATCHES])
    try:
        outcomes = registry.install_all(vllm_cpu.__version__)
        assert [o.status for o in outcomes] == ["applied"] * 5   # int4-head also brings the scoring scope
        assert outcomes[2].reason == "already applied"
    finally:
        for p in reversed(registry.patches):
            p.revert()


def test_dflash_block_fp8_qkv_is_declined_mtp_is_not(w4):
    from vllm.model_executor.layers.linear import QKVParallelLinear
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod

    def fp8_qkv():
        layer = QKVParallelLinear(256, 64, 2, 2, bias=False, params_dtype=torch.bfloat16, disable_tp=True,
                                  prefix="model.layers.4.self_attn.qkv_proj")
        n = layer.weight.shape[0]
        layer.weight = torch.nn.Parameter((torch.randn(n, 256) * 0.02).to(torch.float8_e4m3fn), requires_grad=False)
        layer.weight_scale_inv = torch.nn.Parameter(torch.ones(-(-n // 128), 2), requires_grad=False)
        layer.orig_dtype = torch.bfloat16
        return layer

    method = types.SimpleNamespace(block_quant=True, weight_block_size=[128, 128])
    for proposer_method, converted in (("dflash", False), ("mtp", True)):
        layer = fp8_qkv()
        with DRAFT_SCOPE.entered(proposer_method):
            assert DRAFT_SCOPE.method() == proposer_method
            reason = w4.decline_reason(method, layer, "fp8")
        assert (reason is None) == converted, (proposer_method, reason)
        if not converted:
            assert "DFlash" in reason and "context" in reason
    assert DRAFT_SCOPE.method() is None


def test_mtp_drafter_under_radiance_fp8_gets_4bit_weights(w4):
    """An MTP drafter is built with the target's quant config: under radiance_fp8 (fp8-stream's) its
    linears carry the radiance_fp8 methods, and the w4-drafter converts those too, inside the bracket."""
    from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear

    from radiance.fp8_stream.linear import Fp8StreamConfig, Fp8StreamLinearMethod

    cfg = Fp8StreamConfig()
    bf = torch.bfloat16
    qkv = QKVParallelLinear(256, 64, 4, 2, bias=False, params_dtype=bf, disable_tp=True, quant_config=cfg,
                            prefix="mtp.layers.0.self_attn.qkv_proj")
    o = RowParallelLinear(256, 256, bias=False, params_dtype=bf, disable_tp=True, quant_config=cfg,
                          prefix="mtp.layers.0.self_attn.o_proj")
    target_o = RowParallelLinear(256, 256, bias=False, params_dtype=bf, disable_tp=True, quant_config=cfg,
                                 prefix="model.layers.3.self_attn.o_proj")
    gen = torch.Generator().manual_seed(1)
    for layer in (qkv, o, target_o):
        assert isinstance(layer.quant_method, Fp8StreamLinearMethod)
        layer.weight.data.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.02)
    w_ref = o.weight.data.clone()
    _load_draft([qkv, o])
    for layer in (qkv, o):
        assert isinstance(layer.quant_method, convert.W4Method), layer.prefix
        # the converted layer takes bf16 only: it must not pass on the fp8-input declaration
        assert layer.quant_method.radiance_fp8_input is None
    x = torch.randn(3, 256, generator=gen).to(bf)
    got = o.quant_method.apply(o, x).float()
    assert float((got - x.float() @ w_ref.float().t()).norm() / got.norm()) < 0.1
    # the target's linear, loaded outside the bracket, keeps the W8A8 method
    target_o.quant_method.process_weights_after_loading(target_o)
    assert isinstance(target_o.quant_method, Fp8StreamLinearMethod) and target_o.weight.dtype != bf


def test_v2_speculators_drafter_load_is_bracketed_faked_load_as_v2_runs_on_gpus_only(vllm_cpu, monkeypatch):
    """Model Runner V2 loads its drafter in ``DraftModelSpeculator.load_model`` (MTP through
    TargetDependentARSpeculator's ``super().load_model``). V2 needs a GPU, so the load itself is faked here
    (each layer processed as vLLM's loader does); the class chain and the bracket are vLLM's and radiance's."""
    from vllm.v1.worker.gpu.spec_decode.mtp.speculator import MTPSpeculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    seen = []

    def fake_load_model(spec, target_model):
        seen.append((DRAFT_SCOPE.active(), DRAFT_SCOPE.method()))
        for layer in spec.layers:
            layer.quant_method.process_weights_after_loading(layer)
        spec.supports_mm_inputs = False

    monkeypatch.setattr(DraftModelSpeculator, "load_model", fake_load_model)
    monkeypatch.setenv("RADIANCE_W4_DRAFTER", "1")
    monkeypatch.delenv("RADIANCE_W4_GROUP_SIZE", raising=False)
    version = vllm_cpu.__version__
    loads = DRAFT_SCOPE.loads
    assert DRAFT_SCOPE.install(version).status == "applied"
    patch = W4DrafterPatch()
    try:
        assert patch.install(version).status == "applied"
        layers = _linears()
        spec = MTPSpeculator.__new__(MTPSpeculator)   # vLLM's class, without its engine
        spec.method, spec.layers = "mtp", list(layers.values())
        spec.load_model(target_model=None)
        assert seen == [(True, "mtp")] and not DRAFT_SCOPE.active() and DRAFT_SCOPE.loads == loads + 1
        assert isinstance(layers["qkv"].quant_method, convert.W4Method)
        assert patch.converted_total > 0
    finally:
        patch.revert()
        DRAFT_SCOPE.revert()
    assert DraftModelSpeculator.load_model is fake_load_model   # reverted: vLLM's own method back
