"""Fused GDN gated RMSNorm + dynamic fp8 quantisation (one launch): the epilogue that hands a
Gated DeltaNet layer's out_proj its ``(q, scale)`` input directly.

``gdn_norm_quant(x [T, H*D], z [T, H*D], weight [D], eps, group_size=0, fp8_dtype=None)
-> (q [T, H*D] fp8, scale [T, 1] or [T, H*D/128] fp32)`` replaces, in
``QwenGatedDeltaNetAttention._output_projection``, the stock ``self.norm(core_attn_out, z)``
followed by the W8A8 out_proj's own quantisation of that normed activation.

What the stock norm computes (vLLM 0.32.0, layers/layernorm.py ``RMSNormGated``, built by
the Qwen GDN as ``RMSNormGated(head_v_dim, eps, group_size=None, norm_before_gate=True,
activation=output_gate_type)``, with "swish" renamed "silu"): ``forward_native`` -- what the
CPU runs (CustomOp.forward_cpu) -- calls ``forward_static``, which widens x, z and the weight
to fp32 and, per head (the norm is applied to [T, H, D] over its last dim):
``var = x.pow(2).mean(-1)``, ``x * rsqrt(var + eps)``, ``* weight`` (fp32; a plain weight,
no Gemma offset), ``* silu(z)`` (fp32 silu: ATen computes ``z / (1 + exp(-z))``), and only
then ``.to(x.dtype)``: ONE rounding to the activation dtype, at the end. (The CUDA path runs
FLA's Triton ``rmsnorm_fn`` with the same order; "sigmoid" gating is not taken here.) The
out_proj then quantises the [T, H*D] activation with QuantFP8's arithmetic, per token over
all H*D columns or per group of 128 (``quantize_reference``, shared with add_rms_quant).

Rounding points, identical in the Triton kernel and ``gdn_norm_quant_reference``: squares
in fp32; each head's sum of squares order-free (add_rms_quant's fixed-point sum: scaled by a
power of two from the head's largest square, truncated to int64, summed, converted back);
``/ D``, ``sqrt`` and ``1 / sqrt`` correctly rounded; ``(x * rstd) * w``; silu as
``z / (1 + e)`` correctly rounded with ``e = exp(-z)`` from fp8_common's own exp (plain
IEEE adds and multiplies, reproducible by torch); the product rounded once to x.dtype; then
the shared fp8 quantiser (amax by a max reduction, exact in any order). Compiled with fp
fusion off. Against stock only the last fp32 bit of the variance sum, of rsqrt and of exp
can differ, which moves a normed value by one bf16 ulp in rare cases (the test measures how
often against vLLM's own module on CPU).

The kernel holds one token's row as an [HB, D] block (HB = H padded to a power of two,
D a power of two): per-head statistics are row reductions of that block, the quantiser sees
it in add_rms_quant's [BLOCK / 8, 8] layout. ``z`` may be a row-strided view (the GDN's
fix_query_key_value_ordering slices it out of in_proj_qkvz's output).
"""
from __future__ import annotations

import functools

import torch

from . import aot, shipped
from . import fp8_common as fc
from .dispatch import DeviceInfo, describe, eager_gpu_call, fp8_dtype_for_device, plan_cache, register_library_op

try:  # Triton is optional: the reference runs everywhere.
    import triton
    import triton.language as tl

    from .fp8_common import exp_f32, pow2, quant_row, round_to, sumsq_scale
except ImportError:  # pragma: no cover - CPU images without Triton
    triton = None
    tl = None

# A head is held as one power-of-two block; Qwen3-Next's head_v_dim is 128, the tiny test
# model's 64.
HEAD_DIMS = (16, 32, 64, 128, 256)


def head_log2(d: int) -> int:
    """LOG2 of the fixed-point sum over one head (headroom for d int64 terms)."""
    return max(d, 1).bit_length() - 1


def check_shapes(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int) -> int:
    """Validates the arguments; returns the number of heads."""
    if x.dim() != 2 or z.shape != x.shape:
        raise ValueError(f"x and z must both be [T, H*D], got {tuple(x.shape)} and {tuple(z.shape)}")
    d = weight.numel()
    if weight.dim() != 1 or d not in HEAD_DIMS:
        raise ValueError(f"weight must be [D] with D in {HEAD_DIMS}, got {tuple(weight.shape)}")
    if x.shape[1] % d:
        raise ValueError(f"row width {x.shape[1]} is not a multiple of the head size {d}")
    fc.check_group(group_size, x.shape[1])
    return x.shape[1] // d


# ---------------------------------------------------------------------------------------
# PyTorch reference (runs on any device; the op's CPU implementation)
# ---------------------------------------------------------------------------------------

def silu_reference(z: torch.Tensor) -> torch.Tensor:
    """fp32 silu with the kernel's rounding points: z / (1 + exp(-z)), correctly rounded."""
    z = z.to(torch.float32)
    return fc.div_rn(z, 1.0 + fc.exp_reference(-z))


def gdn_norm_reference(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
                       ) -> torch.Tensor:
    """The norm half: per-head RMSNorm(x) * weight * silu(z), rounded once to x.dtype."""
    t, k = x.shape
    d = weight.numel()
    xf = x.to(torch.float32).view(t, k // d, d)
    var = fc.div_rn(fc.exact_sumsq(xf * xf, head_log2(d)), d)
    rstd = fc.div_rn(torch.ones_like(var), fc.sqrt_rn(var + eps))
    out = (xf * rstd.unsqueeze(-1)) * weight.to(torch.float32)
    out = out * silu_reference(z.reshape(t, k // d, d))
    return out.to(x.dtype).view(t, k)


def gdn_norm_quant_reference(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                             group_size: int = 0, fp8_dtype: torch.dtype | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, x.device)
    check_shapes(x, z, weight, group_size)
    return fc.quantize_reference(gdn_norm_reference(x, z, weight, eps), group_size, fp8_dtype)


# ---------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _gdn_norm_quant_kernel(x_ptr, z_ptr, w_ptr, q_ptr, s_ptr, H, stride_z, eps,
                               D: tl.constexpr, HB: tl.constexpr, LOG2: tl.constexpr,
                               FMAX: tl.constexpr, MIN_SCALE: tl.constexpr, GROUP: tl.constexpr,
                               FNUZ: tl.constexpr, NATIVE: tl.constexpr = False,
                               HW_FP8: tl.constexpr = False):
        row = tl.program_id(0).to(tl.int64)
        act: tl.constexpr = x_ptr.dtype.element_ty
        K = H * D
        heads = tl.arange(0, HB)[:, None]
        dims = tl.arange(0, D)[None, :]
        cols = heads * D + dims
        mask = heads < H
        # All three loads are issued before the first reduction.
        w = tl.load(w_ptr + dims).to(tl.float32)
        x = tl.load(x_ptr + row * K + cols, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + row * stride_z + cols, mask=mask, other=0.0).to(tl.float32)
        sq = x * x
        f = sumsq_scale(tl.max(sq, axis=1), LOG2)
        total = tl.sum((sq * pow2(f)[:, None]).to(tl.int64), axis=1)
        sumsq = total.to(tl.float32) * pow2(-f)
        var = tl.math.div_rn(sumsq, tl.full([HB], D, tl.float32))
        rstd = tl.math.div_rn(tl.full([HB], 1.0, tl.float32), tl.math.sqrt_rn(var + eps))
        silu = tl.math.div_rn(z, 1.0 + exp_f32(-z))
        out = ((x * rstd[:, None]) * w) * silu
        xn = round_to(out, act, NATIVE).to(tl.float32)
        # The quantiser's layout ([BLOCK / 8, 8], flat index i * 8 + j): the same row-major
        # order as [HB, D], padded heads are zeros (no effect on any amax; never stored).
        xn = tl.reshape(xn, [HB * D // 8, 8])
        quant_row(xn, xn, row, q_ptr, s_ptr, K, FMAX, MIN_SCALE, GROUP, FNUZ, HB * D, 0, HW_FP8)


def launch_params(h: int, d: int) -> tuple[int, int, int]:
    """(HB, LOG2, num_warps) for a row of h heads of d."""
    hb = fc.triton_next_pow2(h)
    lanes = hb * d
    num_warps = 4 if lanes <= 2048 else 8 if lanes <= 8192 else 16
    return hb, head_log2(d), num_warps


class _Plan:
    """Everything about a launch that depends only on (H, D, group, dtypes, device)."""

    __slots__ = ("consts", "num_warps", "q_as_bytes", "scale_cols")

    def __init__(self, h: int, d: int, group_size: int, fp8_dtype: torch.dtype, dev: DeviceInfo):
        if fp8_dtype not in fc.FP8_DTYPES:
            raise ValueError(f"fp8_dtype must be one of {fc.FP8_DTYPES}, got {fp8_dtype}")
        hb, log2, self.num_warps = launch_params(h, d)
        self.scale_cols = h * d // group_size if group_size else 1
        self.consts = {"D": d, "HB": hb, "LOG2": log2, **fc.quant_constexprs(group_size, fp8_dtype),
                       **fc.native_constexprs(dev, fp8_dtype)}
        self.q_as_bytes = fc.codes_as_bytes(fp8_dtype, dev)


_PLANS: dict[tuple, _Plan] = plan_cache()


def gdn_norm_quant_triton(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                          group_size: int = 0, fp8_dtype: torch.dtype | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    t, k = x.shape
    device = x.device
    if fp8_dtype is None:
        fp8_dtype = fp8_dtype_for_device(device)
    h = check_shapes(x, z, weight, group_size)
    d = k // h
    key = (h, d, group_size, fp8_dtype, x.dtype, z.dtype, weight.dtype, device)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _Plan(h, d, group_size, fp8_dtype, describe(device))
    if not x.is_contiguous():
        x = x.contiguous()
    if z.stride(1) != 1:
        z = z.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    q = torch.empty((t, k), dtype=fp8_dtype, device=device)
    scale = torch.empty((t, plan.scale_cols), dtype=torch.float32, device=device)
    if t:
        _gdn_norm_quant_kernel[(t,)](
            x, z, weight, q.view(torch.uint8) if plan.q_as_bytes else q, scale, h, z.stride(0),
            float(eps), num_warps=plan.num_warps, enable_fp_fusion=False, **plan.consts)
    return q, scale


# ---------------------------------------------------------------------------------------
# The op (dispatch.register_library_op)
# ---------------------------------------------------------------------------------------

def _gdn_norm_quant_gpu(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                        group_size: int, fp8_dtype: torch.dtype
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is None:
        return gdn_norm_quant_reference(x, z, weight, eps, group_size, fp8_dtype)
    return gdn_norm_quant_triton(x, z, weight, eps, group_size, fp8_dtype)


def _gdn_norm_quant_cpu(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                        group_size: int, fp8_dtype: torch.dtype
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    return gdn_norm_quant_reference(x, z, weight, eps, group_size, fp8_dtype)


def _gdn_norm_quant_fake(x, z, weight, eps, group_size, fp8_dtype):
    fc.check_group(group_size, x.shape[1])
    t, k = x.shape
    return (x.new_empty((t, k), dtype=fp8_dtype),
            x.new_empty(fc.scale_shape(t, k, group_size), dtype=torch.float32))


_OP = register_library_op("gdn_norm_quant", _gdn_norm_quant_cpu, _gdn_norm_quant_gpu, _gdn_norm_quant_fake)


def gdn_norm_quant(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                   group_size: int = 0, fp8_dtype: torch.dtype | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [T, H*D] fp8, scale [T, 1] or [T, H*D/128] fp32) of RMSNormGated(x, z) (per head of
    D = weight.numel(), norm before a silu gate), rounded to x.dtype, then fp8-quantised."""
    if fp8_dtype is None:
        fp8_dtype = fp8_dtype_for_device(x.device)
    if eager_gpu_call(x, z, weight):
        return gdn_norm_quant_triton(x, z, weight, float(eps), int(group_size), fp8_dtype)
    return _OP(x, z, weight, float(eps), int(group_size), fp8_dtype)


# ---------------------------------------------------------------------------------------
# AOT: Qwen3.5-27B's value heads per rank at TP=2, both activation-scale modes, the device's fp8
# format (radiance.kernels.aot). z is a row-strided view of in_proj_qkvz's output, as in the GDN.
# ---------------------------------------------------------------------------------------

def _aot_launches(dev: DeviceInfo, arch: str):
    if not dev.has_fp8:
        return
    for group in shipped.FP8_GROUPS:
        yield (f"H={shipped.GDN_HEADS} D={shipped.GDN_HEAD_DIM} group={group}",
               functools.partial(_aot_call, shipped.GDN_HEADS, shipped.GDN_HEAD_DIM, group))


def _aot_call(h: int, d: int, group: int) -> None:
    k = h * d
    x = torch.empty((1, k), dtype=torch.bfloat16)
    # z as a view of the projection's output row, after q, k (8 key heads x 128 each per rank)
    # and v; a contiguous z specialises the same (aligned, row stride a multiple of 16)
    qkvz = torch.empty((1, 2 * k + 2 * 1024), dtype=torch.bfloat16)
    z = qkvz[:, k + 2 * 1024:]
    gdn_norm_quant_triton(x, z, torch.empty(d, dtype=torch.bfloat16), 1e-6, group)


if triton is not None:
    aot.register("gdn_norm_quant", "fp8_stream", _aot_launches)
