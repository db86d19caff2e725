"""radiance_w4: the target's linears in 4 bits as fp8-stream consumers. Real vLLM linears (one gloo
rank) quantised at load from bf16 and from a block-fp8 checkpoint, repacked from symmetric GPTQ; the
two inputs (Fp8Activation -> W4A8, tensor -> W4A16); the bounded chunking; the checkpoints it
refuses and why; the drafter left to w4-drafter; and the tiny Qwen3.5 planned with every site fused
and every consumer on W4A8."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from radiance.fp8_stream import w4_linear as w4
from radiance.fp8_stream.activation import Fp8Activation
from radiance.fp8_stream.plan import Fp8Input, consumer_gemms, find_core, fp8_input_of, plan_stream
from radiance.kernels import w4_layout as layout
from radiance.kernels import w4a16_gemm as wk
from radiance.kernels import w4a8_gemm as w8
from radiance.kernels.fp8_common import quantize_reference
from radiance.w4 import quant
from radiance.w4.convert import dequant_block_fp8
from radiance.w4.scope import DRAFT_SCOPE

FN = torch.float8_e4m3fn
BF16 = torch.bfloat16


def _layer(kind: str, cfg, k: int, n: int):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    with set_current_vllm_config(VllmConfig()):
        if kind == "merged":
            return MergedColumnParallelLinear(k, [n // 2, n // 2], bias=False, quant_config=cfg, params_dtype=BF16,
                                              prefix="model.layers.0.mlp.gate_up_proj")
        if kind == "qkv":
            return QKVParallelLinear(k, 32, 4, 2, bias=False, quant_config=cfg, params_dtype=BF16,
                                     prefix="model.layers.0.self_attn.qkv_proj")
        return RowParallelLinear(k, n, bias=False, quant_config=cfg, params_dtype=BF16,
                                 prefix="model.layers.0.mlp.down_proj")


@pytest.fixture(scope="module")
def make_linear(tp1_group):
    """make_linear(kind, k, n) -> (a real vLLM linear under radiance_w4 with random bf16 weights,
    processed as after a load, the bf16 weight)."""
    def make(kind: str, k: int = 256, n: int = 192, seed: int = 0):
        layer = _layer(kind, w4.W4Config(), k, n)
        gen = torch.Generator().manual_seed(seed)
        w = (torch.randn(layer.weight.shape, generator=gen) * 0.05).to(BF16)
        layer.weight.data.copy_(w)
        layer.quant_method.process_weights_after_loading(layer)
        return layer, w

    return make


@pytest.mark.parametrize("kind", ["merged", "qkv", "row"])
def test_bf16_weights_are_quantised_at_load_with_the_projects_quantiser(make_linear, kind):
    layer, w = make_linear(kind)
    method = layer.quant_method
    assert isinstance(method, w4.W4LinearMethod) and method.radiance_gemm == "w4a8"
    assert layer.weight.numel() == 0  # the bf16 shard is gone
    qw, sc = quant.quantize_pack(w, 128, scale_dtype=BF16)
    assert torch.equal(layer.w4_qweight, qw) and torch.equal(layer.w4_scales, sc)
    assert fp8_input_of(layer) == Fp8Input(0, FN)


@pytest.mark.parametrize("kind", ["merged", "row"])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_carrier_runs_w4a8_and_tensor_runs_w4a16(make_linear, kind, m):
    layer, w = make_linear(kind)
    x = torch.randn(m, w.shape[1]).to(BF16)
    q, scale = quantize_reference(x, 0, FN)
    got8, _ = layer(Fp8Activation(q, scale, BF16))
    got16, _ = layer(x)
    assert torch.equal(got8, w8.w4a8_gemm_reference(q, scale, layer.w4_qweight, layer.w4_scales, 128, BF16))
    assert torch.equal(got16, wk.w4a16_gemm_reference(x, layer.w4_qweight, layer.w4_scales, 128))
    want = x.float() @ w.float().t()
    for got in (got8, got16):  # both within the 4-bit error of the bf16 product
        assert float((got.float() - want).norm() / want.norm()) < 0.15


def test_leading_dims_are_kept(make_linear):
    layer, w = make_linear("row")
    x = torch.randn(2, 3, w.shape[1]).to(BF16)
    q, scale = quantize_reference(x.reshape(6, -1), 0, FN)
    out, _ = layer(Fp8Activation(q.reshape(2, 3, -1), scale, BF16))
    assert out.shape == (2, 3, w.shape[0])


def test_chunks_bound_the_temporaries_and_change_nothing(monkeypatch):
    """At most CHUNK_ROWS rows are ever materialised, and the result is the whole-matrix quantiser's
    (per (row, group) decisions do not depend on the chunk)."""
    w = (torch.randn(200, 256) * 0.05).to(BF16)
    monkeypatch.setattr(w4, "CHUNK_ROWS", 64)
    seen = []

    def rows_of(r0, r1):
        seen.append(r1 - r0)
        return w[r0:r1]

    qw, sc = w4.quantise_chunked(200, 256, rows_of, w.device, BF16)
    assert max(seen) == 64 and sum(seen) == 200
    want_q, want_s = quant.quantize_pack(w, 128, scale_dtype=BF16)
    assert torch.equal(qw, want_q) and torch.equal(sc, want_s)


def test_block_fp8_checkpoint_is_dequantised_per_chunk_and_requantised(tp1_group):
    cfg = w4.W4Config.from_config({"quant_method": "fp8", "activation_scheme": "dynamic",
                                   "weight_block_size": [128, 128]})
    assert isinstance(cfg, w4.W4BlockFp8Config) and cfg.get_name() == "radiance_w4"
    layer = _layer("merged", cfg, 256, 384)
    assert isinstance(layer.quant_method, w4.W4BlockFp8LinearMethod)
    gen = torch.Generator().manual_seed(3)
    layer.weight.data.copy_((torch.randn(layer.weight.shape, generator=gen) * 100).to(FN))
    layer.weight_scale_inv.data.copy_(torch.rand(layer.weight_scale_inv.shape, generator=gen) * 1e-3 + 1e-4)
    bf16 = dequant_block_fp8(layer.weight.data, layer.weight_scale_inv.data, (128, 128), BF16)
    layer.quant_method.process_weights_after_loading(layer)
    qw, sc = quant.quantize_pack(bf16, 128, scale_dtype=BF16)
    assert torch.equal(layer.w4_qweight, qw) and torch.equal(layer.w4_scales, sc)
    assert layer.weight.numel() == 0 and not hasattr(layer, "weight_scale_inv")
    assert fp8_input_of(layer) == Fp8Input(0, FN)


def gptq_pack(codes: torch.Tensor) -> torch.Tensor:
    """codes int8 [N, K] in -8..7 -> GPTQ's [K/8, N] int32 (u = q + 8, low nibble first along K)."""
    u = (codes.to(torch.int64) + 8).t()                      # [K, N]
    k, n = u.shape
    words = torch.zeros(k // 8, n, dtype=torch.int64)
    for i in range(8):
        words |= u[i::8] << (4 * i)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def test_gptq_symmetric_is_repacked_value_for_value(tp1_group):
    n, k = 96, 384
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    scales = (torch.rand(k // 128, n, generator=gen) * 0.01).to(BF16)
    qw, sc = w4.repack_gptq(gptq_pack(codes), scales, rows=32)
    got_codes, got_scales = layout.unpack(qw, sc, k, 128)
    assert torch.equal(got_codes, codes) and torch.equal(got_scales, scales.t())
    # through a real linear: GPTQ's tensors loaded as GPTQ shards them, repacked after load
    cfg = w4.W4Config.from_config({"quant_method": "gptq", "bits": 4, "sym": True, "group_size": 128,
                                   "desc_act": False})
    layer = _layer("row", cfg, k, n)
    assert isinstance(layer.quant_method, w4.W4GptqLinearMethod)
    layer.qweight.data.copy_(gptq_pack(codes))
    layer.scales.data.copy_(scales)
    layer.qzeros.data.fill_(0x77777777)  # legacy "zero - 1" words; the symmetric zero is 8 regardless
    layer.g_idx.data.copy_(torch.arange(k, dtype=torch.int32) // 128)
    layer.quant_method.process_weights_after_loading(layer)
    assert torch.equal(layer.w4_qweight, qw) and torch.equal(layer.w4_scales, sc)
    assert not hasattr(layer, "qweight") and fp8_input_of(layer) == Fp8Input(0, FN)


@pytest.mark.parametrize("cfg,needle", [
    ({"quant_method": "gptq", "bits": 4, "sym": False, "group_size": 128, "desc_act": False}, "asymmetric GPTQ"),
    ({"quant_method": "gptq", "bits": 8, "sym": True, "group_size": 128, "desc_act": False}, "bits 8"),
    ({"quant_method": "gptq", "bits": 4, "sym": True, "group_size": 64, "desc_act": False}, "group_size 64"),
    ({"quant_method": "gptq", "bits": 4, "sym": True, "group_size": 128, "desc_act": True}, "act-order"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "AWQ is asymmetric"),
    ({"quant_method": "mxfp4"}, "MXFP4 codes are e2m1"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "no weight_block_size"),
    ({"quant_method": "compressed-tensors"}, "'compressed-tensors' is not one radiance_w4 converts"),
])
def test_formats_it_cannot_serve_are_refused_with_the_reason(cfg, needle):
    assert needle in w4.format_problem(cfg)
    with pytest.raises(ValueError, match="--quantization radiance_w4 cannot serve this checkpoint"):
        w4.W4Config.override_quantization_method(cfg, "radiance_w4")
    assert w4.W4Config.override_quantization_method(cfg, None) is None  # not asked for: vLLM decides


def test_takes_what_it_can_serve():
    for cfg in ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
                {"quant_method": "gptq", "bits": 4, "sym": True, "group_size": 128, "desc_act": False}):
        assert w4.W4Config.override_quantization_method(cfg, "radiance_w4") == "radiance_w4"


def test_registered_with_vllm():
    from vllm.model_executor.layers.quantization import get_quantization_config

    import radiance.plugin as plugin

    assert "radiance.fp8_stream.w4_linear" in plugin.QUANT_MODULES
    assert get_quantization_config("radiance_w4") is w4.W4Config


def test_drafter_linears_stay_bf16_for_w4_drafter(tp1_group):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    layer = _layer("row", w4.W4Config(), 256, 128)
    layer.weight.data.normal_(0, 0.05)
    with DRAFT_SCOPE.entered("mtp"):
        layer.quant_method.process_weights_after_loading(layer)
    assert isinstance(layer.quant_method, UnquantizedLinearMethod) and not hasattr(layer, "w4_qweight")
    assert fp8_input_of(layer) is None


def test_gates_and_heads_stay_unquantised():
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    cfg = w4.W4Config()
    layer = LinearBase.__new__(LinearBase)
    for prefix in ("model.layers.3.mlp.gate", "model.layers.3.mlp.shared_expert_gate", "lm_head",
                   "visual.blocks.0.attn.qkv"):
        assert isinstance(cfg.get_quant_method(layer, prefix), UnquantizedLinearMethod), prefix
    assert cfg.get_quant_method(torch.nn.Embedding(4, 4), "model.embed_tokens") is None


# --- the tiny Qwen3.5 under radiance_w4: every site fused, every consumer W4A8 ----------------

@pytest.fixture(scope="module")
def qwen35_w4(tp1_group, tmp_path_factory):
    pytest.importorskip("vllm.model_executor.models.qwen3_5")
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    from tools import tinymodel
    from tools.tinymodel import config

    path = tinymodel.ensure(tmp_path_factory.mktemp("q35w4"), arch=config.QWEN3_5.name)
    vc = VllmConfig(model_config=ModelConfig(model=str(path), dtype="bfloat16", enforce_eager=True,
                                             quantization="radiance_w4"))
    vc.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vc), set_default_torch_dtype(BF16):
        model = Qwen3_5ForCausalLM(vllm_config=vc, prefix="")
    torch.manual_seed(0)
    for module in model.modules():  # what the loader does after loading the checkpoint
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(module, "weight"):
            module.weight.data.normal_(0, 0.05)
            method.process_weights_after_loading(module)
    return model


def test_every_qwen35_site_streams_into_w4a8(qwen35_w4):
    core = find_core(qwen35_w4)
    plan = plan_stream(core, 2, 1)
    assert plan.summary() == "3 input + 4 post-attention epilogues over 4 layers (7 all-reduces fused)"
    # every streamed site's consumers: qkv_proj (1 attention layer) or in_proj_qkvz + in_proj_ba (3 GDN
    # layers) after each input epilogue but the first layer's, gate_up_proj after every post-attention one
    assert consumer_gemms(core, plan) == {"w4a8": 4 + 5}
    for layer in core.layers:
        for lin in (layer.mlp.gate_up_proj, layer.mlp.down_proj):
            assert isinstance(lin.quant_method, w4.W4LinearMethod) and hasattr(lin, "w4_qweight")
