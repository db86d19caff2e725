"""W8A8 fp8 GEMM that takes the activation already quantised: ``out = (A * sa) @ (W * sw)^T``.

The consuming linears of the fp8-stream contract receive ``(q, scale)`` from
add_rms_quant / gdn_norm_quant instead of a bf16 activation. ``scaled_mm`` runs that
product with the best implementation the device has:

* ``torch._scaled_mm`` where the arch has it for the scale layout: per-tensor scales on
  sm_89+ and gfx94x/gfx95x; per-token x per-channel ("rowwise") on sm_90+ and gfx950;
* the Triton kernel below everywhere else on a GPU -- RDNA4 (gfx1201) has fp8 WMMA but no
  ``_scaled_mm`` in the pinned torch -- and for per-group (1x128) activation scales with
  per-channel or 128x128 block weight scales (the layout of Qwen3-Next's fp8 checkpoints);
* the PyTorch reference on CPU.

Scale layouts (fp32):
  activation ``a_scale``: [1] / [1, 1] per tensor, [M, 1] per token, [M, K/128] per group;
  weight ``w_scale``: [1] per tensor, [N] / [N, 1] per output channel,
  [ceil(N/128), K/128] per 128x128 block.
Weight codes are [N, K] row-major, as vLLM stores them before its transpose.

The kernel accumulates each 128-wide K block's fp8 products in fp32 and applies the group
scales per block (or the per-token/per-channel scales once at the end); the reference
does the same, so they agree to fp32 summation-order noise, not bit for bit. On Hopper,
tiles with M > 16 run on fp8 wgmma, which adds products with reduced precision before the
fp32 accumulator (measured on an H200: up to 1.7e-4 of the largest output).
"""
from __future__ import annotations

import functools

import torch

from . import aot, shipped
from .dispatch import DeviceInfo, describe, register_library_op, use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None
    tl = None

GROUP = 128


# ---------------------------------------------------------------------------------------
# Scale layouts
# ---------------------------------------------------------------------------------------

def _a_layout(a_scale: torch.Tensor, m: int, k: int) -> str:
    if a_scale.numel() == 1:
        return "tensor"
    if a_scale.dim() == 2 and a_scale.shape == (m, 1):
        return "token"
    if a_scale.dim() == 2 and k % GROUP == 0 and a_scale.shape == (m, k // GROUP):
        return "group"
    raise ValueError(f"a_scale of shape {tuple(a_scale.shape)} fits no layout for A [{m}, {k}] "
                     f"(expected [1], [M, 1] or [M, K/{GROUP}])")


def _w_layout(w_scale: torch.Tensor, n: int, k: int) -> str:
    if w_scale.numel() == 1:
        return "tensor"
    if w_scale.shape in ((n,), (n, 1)):
        return "channel"
    if w_scale.dim() == 2 and k % GROUP == 0 and w_scale.shape == (-(-n // GROUP), k // GROUP):
        return "block"
    raise ValueError(f"w_scale of shape {tuple(w_scale.shape)} fits no layout for W [{n}, {k}] "
                     f"(expected [1], [N] or [N, 1], or [ceil(N/{GROUP}), K/{GROUP}])")


def _expand_scales(a_scale, w_scale, m, n, k):
    """Per-element-of-K-block scales as [M, KB] and [N, KB] fp32 (KB = K blocks)."""
    kb = -(-k // GROUP)
    a_l, w_l = _a_layout(a_scale, m, k), _w_layout(w_scale, n, k)
    a = a_scale.to(torch.float32)
    w = w_scale.to(torch.float32)
    sa = a.reshape(m, kb) if a_l == "group" else a.reshape(-1, 1).expand(m, kb)
    if w_l == "block":
        sw = w.repeat_interleave(GROUP, dim=0)[:n]
    else:
        sw = w.reshape(-1, 1).expand(n, kb)
    return sa, sw, a_l, w_l


# ---------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------

def fp8_gemm_reference(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                       w_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    m, k = a_q.shape
    n = w_q.shape[0]
    sa, sw, a_l, w_l = _expand_scales(a_scale, w_scale, m, n, k)
    a = a_q.to(torch.float32)
    w = w_q.to(torch.float32)
    if a_l != "group" and w_l != "block":
        # products of fp8 values are exact in fp32; only the sum order differs from the kernel
        acc = (a @ w.t()) * sa[:, :1] * sw[:, :1].t()
    else:
        acc = torch.zeros((m, n), dtype=torch.float32, device=a_q.device)
        for b in range(sa.shape[1]):
            ks = slice(b * GROUP, min(k, (b + 1) * GROUP))
            acc += (a[:, ks] @ w[:, ks].t()) * sa[:, b:b + 1] * sw[:, b:b + 1].t()
    if bias is not None:
        acc = acc + bias.to(torch.float32)
    return acc.to(out_dtype)


# ---------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _fp8_gemm_kernel(a_ptr, w_ptr, sa_ptr, sw_ptr, bias_ptr, out_ptr, M, N, K,
                         stride_sam, stride_sak, stride_swn, stride_swk,
                         A_GROUP: tl.constexpr, W_BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                         UPCAST: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        m_ok = offs_m < M
        n_ok = offs_n < N
        a_rows = a_ptr + offs_m.to(tl.int64)[:, None] * K
        w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BK)):
            ks = kb * BK + offs_k
            k_ok = ks < K
            a = tl.load(a_rows + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:  # fp8 -> fp16 is exact; for targets whose MMA takes no fp8
                a = a.to(tl.float16)
                w = w.to(tl.float16)
            part = tl.dot(a, tl.trans(w), out_dtype=tl.float32)
            if A_GROUP or W_BLOCK:
                if A_GROUP:
                    sa = tl.load(sa_ptr + offs_m * stride_sam + kb * stride_sak, mask=m_ok, other=0.0)
                    part = part * sa[:, None]
                if W_BLOCK:
                    sw = tl.load(sw_ptr + (offs_n // BK) * stride_swn + kb * stride_swk,
                                 mask=n_ok, other=0.0)
                    part = part * sw[None, :]
                acc += part
            else:
                acc += part
        if not A_GROUP:
            sa = tl.load(sa_ptr + offs_m * stride_sam, mask=m_ok, other=0.0)
            acc = acc * sa[:, None]
        if not W_BLOCK:
            sw = tl.load(sw_ptr + offs_n * stride_swn, mask=n_ok, other=0.0)
            acc = acc * sw[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def tile_config(m: int) -> tuple[int, int, int, int]:
    """(BM, BN, num_warps, num_stages): decode M gets narrow rows and more N tiles."""
    if m <= 16:
        return 16, 64, 4, 3
    if m <= 64:
        return 64, 64, 4, 3
    return 128, 128, 8, 3


def _needs_upcast(dev: DeviceInfo) -> bool:
    """fp8 MMA: sm_89+, and on ROCm every arch Triton emulates or has (gfx94x/95x/12)."""
    return dev.backend == "cuda" and dev.capability < (8, 9)  # the interpreter handles fp8 dots


def fp8_gemm_triton(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                    w_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    m, k = a_q.shape
    n = w_q.shape[0]
    a_l, w_l = _a_layout(a_scale, m, k), _w_layout(w_scale, n, k)
    a_q, w_q = a_q.contiguous(), w_q.contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    if m == 0:
        return out
    sa = a_scale.to(torch.float32).reshape(m, -1) if a_l != "tensor" else \
        a_scale.to(torch.float32).reshape(1, 1)
    sw = w_scale.to(torch.float32).reshape(-1, 1) if w_l != "block" else w_scale.to(torch.float32)
    sa, sw = sa.contiguous(), sw.contiguous()
    stride_sam = 0 if a_l == "tensor" else sa.stride(0)
    stride_sak = sa.stride(1) if a_l == "group" else 0
    stride_swn = 0 if w_l == "tensor" else sw.stride(0)
    stride_swk = sw.stride(1) if w_l == "block" else 0
    bm, bn, num_warps, num_stages = tile_config(m)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _fp8_gemm_kernel[grid](
        a_q, w_q, sa, sw, bias if bias is not None else out, out, m, n, k,
        stride_sam, stride_sak, stride_swn, stride_swk,
        A_GROUP=a_l == "group", W_BLOCK=w_l == "block", HAS_BIAS=bias is not None,
        UPCAST=_needs_upcast(describe(a_q.device)), BM=bm, BN=bn, BK=GROUP,
        num_warps=num_warps, num_stages=num_stages)
    return out


# ---------------------------------------------------------------------------------------
# torch._scaled_mm where the arch has it
# ---------------------------------------------------------------------------------------

def scaled_mm_supported(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                        w_scale: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether torch._scaled_mm takes this problem on this device (no trial call)."""
    if not (a_q.is_cuda and hasattr(torch, "_scaled_mm")):
        return False
    m, k = a_q.shape
    n = w_q.shape[0]
    return scaled_mm_takes(_a_layout(a_scale, m, k), _w_layout(w_scale, n, k), n, k, out_dtype,
                           describe(a_q.device))


def scaled_mm_takes(a_l: str, w_l: str, n: int, k: int, out_dtype: torch.dtype, dev: DeviceInfo) -> bool:
    """Whether a GPU described by ``dev`` runs these scale layouts on torch._scaled_mm (else the
    Triton kernel): per tensor on sm_89+ and gfx94x/95x, rowwise on sm_90+ and gfx950."""
    if a_l == "group" or w_l == "block" or k % 16 or n % 16:
        return False
    rowwise = a_l != "tensor" or w_l != "tensor"
    if rowwise and (a_l == "tensor" or w_l == "tensor" or out_dtype != torch.bfloat16):
        return False  # rowwise wants both sides rowwise
    if dev.backend == "hip":
        return dev.arch.startswith("gfx95") if rowwise else dev.arch.startswith(("gfx94", "gfx95"))
    return dev.capability >= (9, 0) if rowwise else dev.capability >= (8, 9)


def _scaled_mm(a_q, a_scale, w_q, w_scale, out_dtype, bias):
    m, n = a_q.shape[0], w_q.shape[0]
    rowwise = a_scale.numel() != 1
    sa = a_scale.to(torch.float32).reshape(m, 1) if rowwise else a_scale.to(torch.float32).reshape(())
    sw = w_scale.to(torch.float32).reshape(1, n) if rowwise else w_scale.to(torch.float32).reshape(())
    return torch._scaled_mm(a_q, w_q.t(), scale_a=sa, scale_b=sw, bias=bias, out_dtype=out_dtype)


# ---------------------------------------------------------------------------------------
# The op and the dispatcher
# ---------------------------------------------------------------------------------------

BACKENDS = ("auto", "scaled_mm", "triton", "reference")


def scaled_mm(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
              backend: str = "auto") -> torch.Tensor:
    """``(a_q * a_scale) @ (w_q * w_scale)^T`` in ``out_dtype``; see the module doc."""
    if backend == "auto":
        return _OP(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if backend == "scaled_mm":
        return _scaled_mm(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if backend == "triton":
        return fp8_gemm_triton(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if backend == "reference":
        return fp8_gemm_reference(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def _fp8_gemm_gpu(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    if scaled_mm_supported(a_q, a_scale, w_q, w_scale, out_dtype):
        return _scaled_mm(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if use_triton(a_q, w_q):
        return fp8_gemm_triton(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    return fp8_gemm_reference(a_q, a_scale, w_q, w_scale, out_dtype, bias)


def _fp8_gemm_cpu(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    return fp8_gemm_reference(a_q, a_scale, w_q, w_scale, out_dtype, bias)


def _fp8_gemm_fake(a_q, a_scale, w_q, w_scale, out_dtype, bias):
    _a_layout(a_scale, a_q.shape[0], a_q.shape[1])
    _w_layout(w_scale, w_q.shape[0], w_q.shape[1])
    return a_q.new_empty((a_q.shape[0], w_q.shape[0]), dtype=out_dtype)


_OP = register_library_op("fp8_gemm", _fp8_gemm_cpu, _fp8_gemm_gpu, _fp8_gemm_fake)


# ---------------------------------------------------------------------------------------
# AOT: the fp8-stream profiles' linears in both radiance_fp8 modes (block-fp8 checkpoint: group x
# block scales; bf16 checkpoint: token x channel) where the Triton kernel serves them, every class
# of M (radiance.kernels.aot).
# ---------------------------------------------------------------------------------------

# Triton's binder compiles an int argument equal to 1 as a constant and marks one divisible by 16:
# one M per (tile, class) covers every M (tests/radiance/kernels/test_aot.py checks M one by one).
def _m_class(m: int) -> tuple:
    return tile_config(m), m == 1, m % 16 == 0


MODES = (("group", "block"), ("token", "channel"))


def _aot_launches(dev: DeviceInfo, arch: str):
    if not dev.has_fp8:
        return
    reps: dict[tuple, int] = {}
    for m in range(1, shipped.MAX_TOKENS + 1):
        reps.setdefault(_m_class(m), m)
    fp8 = dev.fp8_dtype
    for name, (n, k) in shipped.FP8_GEMM.items():
        for a_l, w_l in MODES:
            for m in reps.values():
                a_q, a_scale, w_q, w_scale = _aot_inputs(m, n, k, a_l, w_l, fp8)
                # the op's choice; a [1, 1] per-token scale is a per-tensor one, for instance
                if scaled_mm_takes(_a_layout(a_scale, m, k), _w_layout(w_scale, n, k), n, k,
                                   torch.bfloat16, dev):
                    continue
                yield (f"{name} {a_l}x{w_l} M={m}",
                       functools.partial(fp8_gemm_triton, a_q, a_scale, w_q, w_scale))


def _aot_inputs(m: int, n: int, k: int, a_l: str, w_l: str, fp8: torch.dtype):
    """(a_q, a_scale, w_q, w_scale) as radiance_fp8's linears pass them (fp32 scales)."""
    a_scale = torch.empty((m, k // GROUP) if a_l == "group" else (m, 1), dtype=torch.float32)
    w_scale = torch.empty((-(-n // GROUP), k // GROUP) if w_l == "block" else (n, 1), dtype=torch.float32)
    return torch.empty((m, k), dtype=fp8), a_scale, torch.empty((n, k), dtype=fp8), w_scale


if triton is not None:
    aot.register("fp8_gemm", "fp8_stream", _aot_launches)
