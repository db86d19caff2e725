"""``radiance_w4``: the target's linears in 4 bits (the project's packed layout, symmetric, group 128),
consumers of the fp8 stream.

The seeds served a 4-bit export, and fp8-stream's guard required every consuming linear to run
their W4A8 kernel: decode is bound by weight bytes, and 4 bits read half of what fp8 reads. This
config (registered with vLLM's ``register_quantization_config`` by the plugin, in every process,
like ``radiance_fp8``) gives every decoder linear a method whose ``apply`` takes

* an ``Fp8Activation`` from an fp8-stream epilogue (per-token codes + scales, ``Fp8Input(0,
  dtype)`` declared, so plan.py counts the site as fused) -> ``w4a8_gemm``: 4-bit codes against
  the fp8 codes, fp32 sums per group, the group scale after each;
* a plain tensor (every input no epilogue produces: o_proj, down_proj, GDN out_proj, and all of
  them with fp8-stream off) -> ``w4a16_gemm`` on the bf16 activation.

Where the weights come from, decided by the checkpoint (``override_quantization_method`` /
``from_config``, as radiance_fp8 does):

* bf16 checkpoint: loaded as a bf16 linear (vLLM shards it per TP rank), then quantised in
  ``process_weights_after_loading`` with the project's quantiser (radiance.w4.quant: clip search
  per (row, group)), 4096 rows at a time, so the temporaries are O(4096 x K) fp32 beside the
  shard, never a whole-model fp32 copy; the bf16 shard is freed layer by layer.
* block-fp8 checkpoint (Qwen's FP8 export, the flagship's): loaded as radiance_fp8's block mode
  loads it (e4m3 + 128x128 inverse scales per shard), then dequantised 4096 rows at a time with its
  own block scales and quantised the same way; the fp8 shard is freed. Linears the checkpoint
  keeps in bf16 and that read a streamed site (GDN in_proj_ba) are quantised from bf16.
* GPTQ checkpoint with ``bits: 4, sym: true, group_size: 128, desc_act: false``: loaded in GPTQ's
  own tensors (qweight ``[K/8, N]``, scales ``[K/G, N]``, qzeros, g_idx; vLLM's parameters shard
  them) and repacked into the project's layout without re-quantising: GPTQ's symmetric codes
  are ``u`` with ``w = s (u - 8)``, which is exactly the layout's offset binary.
  Refused with the reason: asymmetric GPTQ (a zero point per group the layout has no room for),
  other bits / group sizes, act-order (``desc_act``), and every other format (AWQ: asymmetric;
  MXFP4: e2m1 codes with shared power-of-two scales, another code book).

Left as vLLM has them: the MoE router and shared-expert gates, lm_head (int4-head's business), the
embeddings, a VL vision tower, and MoE routed experts (FusedMoE keeps its stock method; a sparse-
MoE site declines in fp8-stream's plan anyway). Linears whose K per shard is no multiple of 128
stay bf16 and declare no fp8 input (their site keeps the stock contract, named in the plan line).
The drafter (an MTP layer is built with the target's quant config) is w4-drafter's: inside its
load bracket these methods keep the bf16 weight (w4-drafter converts it, or stock runs).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config

from radiance.kernels import w4_layout as layout
from radiance.kernels.dispatch import fp8_dtype_for_device
from radiance.kernels.w4a8_gemm import w4a8_gemm
from radiance.w4 import quant
from radiance.w4.convert import dequant_block_fp8
from radiance.w4.scope import DRAFT_SCOPE

from .activation import Fp8Activation
from .base import Fp8InputMethod, skipped
from .block import (
    BLOCK,
    CONSUMER_SUFFIXES,
    BlockFp8StreamLinearMethod,
    Fp8StreamBlockConfig,
    checkpoint_problem,
)
from .linear import Fp8StreamConfig
from .plan import FP8_INPUT_ATTR, Fp8Input

logger = logging.getLogger("radiance")

QUANT_NAME = "radiance_w4"
GROUP = 128
CHUNK_ROWS = quant.DEFAULT_ROWS  # rows quantised at a time (bounded temporaries)
GEMM_ATTR = "radiance_gemm"      # what a consumer runs on an Fp8Activation, read by plan.py's summary


def _scale_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


class W4Consumer:
    """The 4-bit linear's runtime half: packed buffers on the layer, W4A8 / W4A16 in ``apply``."""

    radiance_gemm = "w4a8"

    def install(self, layer: torch.nn.Module, qweight: torch.Tensor, scales: torch.Tensor, k: int) -> None:
        dtype = getattr(layer, "orig_dtype", None) or layer.weight.dtype
        layer.register_buffer("w4_qweight", qweight, persistent=False)
        layer.register_buffer("w4_scales", scales, persistent=False)
        device = qweight.device
        # the loaded weight is freed before the next layer is processed (and before vLLM sizes the KV
        # cache); an empty one keeps code that reads layer.weight.dtype working
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
        layer._radiance_w4 = (scales.shape[1], k)
        setattr(self, FP8_INPUT_ATTR, Fp8Input(0, fp8_dtype_for_device(device)))

    @staticmethod
    def gemm(layer: torch.nn.Module, x, bias: torch.Tensor | None) -> torch.Tensor:
        qw, sc = layer.w4_qweight, layer.w4_scales
        if isinstance(x, Fp8Activation):
            q = x.q.reshape(-1, x.q.shape[-1])
            out = w4a8_gemm(q, x.scale, qw, sc, GROUP, x.dtype)
            lead = x.q.shape[:-1]
        else:
            out = torch.ops.radiance.w4a16_gemm(x.reshape(-1, x.shape[-1]), qw, sc, GROUP)
            lead = x.shape[:-1]
        out = out.reshape(*lead, out.shape[-1])
        return out if bias is None else out + bias


def quantise_rows_into(qweight: torch.Tensor, scales: torch.Tensor, rows: torch.Tensor, r0: int) -> None:
    """Quantise ``rows`` (output rows ``r0 ..``, ``r0`` a multiple of 16) into the packed buffers."""
    q, s = quant.quantize_pack(rows, GROUP, scale_dtype=scales.dtype, rows=CHUNK_ROWS)
    qweight[r0 // layout.ROW_TILE: r0 // layout.ROW_TILE + q.shape[0]] = q
    scales[:, r0:r0 + rows.shape[0]] = s


def quantise_chunked(n: int, k: int, rows_of, device, scale_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (qweight, scales) of an ``[n, k]`` weight whose bf16 rows ``[r0, r1)`` ``rows_of`` returns,
    CHUNK_ROWS at a time: at most one chunk is ever in bf16 / fp32."""
    qshape, sshape = layout.packed_shapes(n, k, GROUP)
    qweight = torch.empty(qshape, dtype=torch.int32, device=device)
    scales = torch.zeros(sshape, dtype=scale_dtype, device=device)
    for r0 in range(0, n, CHUNK_ROWS):
        quantise_rows_into(qweight, scales, rows_of(r0, min(n, r0 + CHUNK_ROWS)), r0)
    return qweight, scales


def _keep_bf16(layer: torch.nn.Module, why: str) -> None:
    """Hand the layer to vLLM's unquantized method (it processes and serves the bf16 weight)."""
    method = UnquantizedLinearMethod()
    layer.quant_method = method
    method.process_weights_after_loading(layer)
    logger.debug("radiance: radiance_w4 keeps %s in bf16: %s", getattr(layer, "prefix", "a linear"), why)


class W4LinearMethod(W4Consumer, Fp8InputMethod):
    """A linear loaded in bf16 (bf16 checkpoint; a bf16 consumer of an fp8 one), quantised at load."""

    def __init__(self) -> None:
        setattr(self, FP8_INPUT_ATTR, None)  # until the weight is packed

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        w = layer.weight.data
        n, k = w.shape
        if DRAFT_SCOPE.active():
            return _keep_bf16(layer, "a drafter linear (w4-drafter's)")
        if k % GROUP:
            return _keep_bf16(layer, f"K = {k} per shard is no multiple of {GROUP}")
        qweight, scales = quantise_chunked(n, k, lambda r0, r1: w[r0:r1], w.device, _scale_dtype(w.dtype))
        self.install(layer, qweight, scales, k)

    def apply(self, layer, x, bias=None):
        return self.gemm(layer, x, bias)


class W4BlockFp8LinearMethod(W4Consumer, BlockFp8StreamLinearMethod):
    """A block-fp8 checkpoint linear, loaded as radiance_fp8 loads it, requantised to 4 bits."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if DRAFT_SCOPE.active():  # the drafter stays radiance_fp8's W8A8 unless w4-drafter converts it
            self.radiance_gemm = "w8a8"
            return super().process_weights_after_loading(layer)
        w, s_inv = layer.weight.data, layer.weight_scale_inv.data
        n, k = w.shape
        bn = BLOCK[0]

        def rows_of(r0: int, r1: int) -> torch.Tensor:  # r0 is a multiple of the 128-row block
            return dequant_block_fp8(w[r0:r1], s_inv[r0 // bn: -(-r1 // bn)], tuple(BLOCK), torch.bfloat16)

        qweight, scales = quantise_chunked(n, k, rows_of, w.device, _scale_dtype(layer.orig_dtype))
        del layer.weight_scale_inv
        self.install(layer, qweight, scales, k)

    def apply(self, layer, x, bias=None):
        if not hasattr(layer, "w4_qweight"):
            return super().apply(layer, x, bias)
        return self.gemm(layer, x, bias)


# ---------------------------------------------------------------------------------------
# GPTQ (symmetric, group 128): repacked, not re-quantised
# ---------------------------------------------------------------------------------------

def gptq_problem(cfg: dict[str, Any]) -> str | None:
    """Why radiance_w4 cannot take this GPTQ checkpoint as it is (None: it can)."""
    if cfg.get("bits") != 4:
        return f"bits {cfg.get('bits')!r}: only 4-bit codes fit the layout"
    if cfg.get("sym") is not True:
        return ("sym is not true: asymmetric GPTQ stores a zero point per group, which the symmetric layout "
                "has no room for (re-quantise from the bf16 checkpoint instead)")
    if cfg.get("group_size") != GROUP:
        return f"group_size {cfg.get('group_size')!r}: the W4A8 GEMM takes group {GROUP}"
    if cfg.get("desc_act"):
        return "desc_act (act-order) is true: its permuted groups (g_idx) are not repacked"
    if cfg.get("dynamic"):
        return "per-module overrides (dynamic) are not taken"
    return None


def format_problem(cfg: dict[str, Any]) -> str | None:
    """Why radiance_w4 cannot serve a checkpoint with this quantization_config (None: it can)."""
    method = str(cfg.get("quant_method", "")).lower()
    if method == "fp8":
        return checkpoint_problem(cfg)
    if method == "gptq":
        return gptq_problem(cfg)
    if method == "awq":
        return "AWQ is asymmetric (a zero point per group): not the symmetric layout; use the bf16 checkpoint"
    if method in ("mxfp4", "mxfp4_moe") or "mxfp4" in method:
        return ("MXFP4 codes are e2m1 with shared power-of-two scales per 32: another code book than the "
                "layout's integers; use the bf16 or FP8 checkpoint")
    return f"quant_method {method!r} is not one radiance_w4 converts (bf16, block-fp8 or symmetric GPTQ)"


def unpack_gptq(qweight: torch.Tensor) -> torch.Tensor:
    """GPTQ's ``[K/8, N]`` int32 (8 codes per word along K, low nibble first) -> codes ``[N, K]`` int8
    in -8..7 (``u - 8``, the symmetric zero)."""
    kw, n = qweight.shape
    shifts = (4 * torch.arange(8, device=qweight.device, dtype=torch.int32)).view(1, 8, 1)
    u = (qweight.view(kw, 1, n) >> shifts) & 0xF          # [K/8, 8, N]: k = 8 w + i
    return (u.reshape(kw * 8, n) - layout.CODE_BIAS).to(torch.int8).t().contiguous()


def repack_gptq(qweight: torch.Tensor, scales: torch.Tensor, rows: int = CHUNK_ROWS
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(GPTQ qweight ``[K/8, N]``, scales ``[K/128, N]``) -> (qweight, scales) in the project's layout,
    ``rows`` output rows at a time; no value changes."""
    kw, n = qweight.shape
    k = kw * 8
    qshape, sshape = layout.packed_shapes(n, k, GROUP)
    out = torch.empty(qshape, dtype=torch.int32, device=qweight.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        out[r0 // layout.ROW_TILE: layout.row_tiles(r1)] = layout.pack_codes(unpack_gptq(qweight[:, r0:r1]))
    sc = torch.zeros(sshape, dtype=scales.dtype, device=scales.device)
    sc[: k // GROUP] = scales
    return out, sc


class W4GptqLinearMethod(W4Consumer, Fp8InputMethod):
    """A symmetric group-128 GPTQ linear: GPTQ's tensors loaded (and sharded) as vLLM's GPTQ
    parameters describe them, repacked after load."""

    def __init__(self) -> None:
        setattr(self, FP8_INPUT_ATTR, None)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                       output_size, params_dtype, **extra_weight_attrs) -> None:
        from vllm.model_executor.parameter import (
            GroupQuantScaleParameter,
            PackedvLLMParameter,
            RowvLLMParameter,
        )

        if input_size_per_partition % GROUP:
            raise ValueError(f"radiance_w4 GPTQ: {getattr(layer, 'prefix', 'a linear')} has K = "
                             f"{input_size_per_partition} per shard, not a multiple of {GROUP}")
        loader = extra_weight_attrs.get("weight_loader")
        n = sum(output_partition_sizes)
        groups = input_size_per_partition // GROUP
        layer.orig_dtype = params_dtype
        layer.register_parameter("qweight", PackedvLLMParameter(
            data=torch.empty(input_size_per_partition // 8, n, dtype=torch.int32), input_dim=0, output_dim=1,
            packed_dim=0, packed_factor=8, weight_loader=loader))
        layer.register_parameter("scales", GroupQuantScaleParameter(
            data=torch.empty(groups, n, dtype=params_dtype), input_dim=0, output_dim=1, weight_loader=loader))
        layer.register_parameter("qzeros", PackedvLLMParameter(
            data=torch.empty(groups, n // 8, dtype=torch.int32), input_dim=0, output_dim=1, packed_dim=1,
            packed_factor=8, weight_loader=loader))
        layer.register_parameter("g_idx", RowvLLMParameter(
            data=torch.empty(input_size_per_partition, dtype=torch.int32), input_dim=0, weight_loader=loader))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        k = layer.qweight.shape[0] * 8
        g_idx = layer.g_idx.data
        if not torch.equal(g_idx.long(), torch.arange(k, device=g_idx.device) // GROUP):
            raise ValueError(f"radiance_w4 GPTQ: {getattr(layer, 'prefix', 'a linear')} has a permuted g_idx")
        qweight, scales = repack_gptq(layer.qweight.data, layer.scales.data.to(_scale_dtype(layer.orig_dtype)))
        for name in ("qweight", "scales", "qzeros", "g_idx"):
            delattr(layer, name)
        self.install(layer, qweight, scales, k)

    def apply(self, layer, x, bias=None):
        return self.gemm(layer, x, bias)


# ---------------------------------------------------------------------------------------
# the configs
# ---------------------------------------------------------------------------------------

@register_quantization_config(QUANT_NAME)
class W4Config(Fp8StreamConfig):
    """``--quantization radiance_w4``: this config on a bf16 checkpoint; ``from_config`` returns the
    block-fp8 or GPTQ variant for those checkpoints."""

    @classmethod
    def get_name(cls) -> str:
        return QUANT_NAME

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        """Take a quantised checkpoint when ``--quantization radiance_w4`` asked for it, or refuse it
        with the reason; without the flag vLLM decides as stock."""
        if user_quant != QUANT_NAME:
            return None
        problem = format_problem(hf_quant_cfg)
        if problem:
            raise ValueError(f"--quantization {QUANT_NAME} cannot serve this checkpoint: {problem}")
        return QUANT_NAME

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> W4Config | Fp8StreamBlockConfig:
        method = str(config.get("quant_method", "")).lower()
        if method:
            problem = format_problem(config)
            if problem:
                raise ValueError(f"--quantization {QUANT_NAME} cannot serve this checkpoint: {problem}")
            if method == "fp8":
                return W4BlockFp8Config.from_checkpoint(config)
            return W4GptqConfig()
        return cls()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod() if skipped(prefix) else W4LinearMethod()
        return None  # embeddings, lm_head, routed experts, attention: stock


class W4BlockFp8Config(Fp8StreamBlockConfig):
    """radiance_w4 on a block-fp8 checkpoint: radiance_fp8's block loading, 4-bit after load."""

    @classmethod
    def get_name(cls) -> str:
        return QUANT_NAME

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            if not self.skipped(prefix):
                return W4BlockFp8LinearMethod()
            return W4LinearMethod() if prefix.endswith(CONSUMER_SUFFIXES) else UnquantizedLinearMethod()
        return super().get_quant_method(layer, prefix)


class W4GptqConfig(W4Config):
    """radiance_w4 on a symmetric group-128 GPTQ checkpoint (the gates and lm_head GPTQ leaves in bf16
    are vLLM's unquantized linears, as in the bf16 mode)."""

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            return UnquantizedLinearMethod() if skipped(prefix) else W4GptqLinearMethod()
        return None



def register() -> str:
    """Importing this module registered the config; the plugin calls this for the log line."""
    return QUANT_NAME
