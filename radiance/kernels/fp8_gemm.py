"""W8A8 fp8 GEMM that takes the activation already quantised: ``out = (A * sa) @ (W * sw)^T``.

The consuming linears of the fp8-stream contract receive ``(q, scale)`` from
add_rms_quant / silu_mul_quant instead of a bf16 activation. ``scaled_mm`` runs that
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

from . import aot
from .dispatch import use_triton

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


def _needs_upcast(device: torch.device) -> bool:
    """fp8 MMA: sm_89+, and on ROCm every arch Triton emulates or has (gfx94x/95x/12)."""
    if device.type != "cuda" or torch.version.hip:
        return False  # the interpreter (CPU tensors) handles fp8 dots
    return torch.cuda.get_device_capability(device) < (8, 9)


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
        UPCAST=_needs_upcast(a_q.device), BM=bm, BN=bn, BK=GROUP,
        num_warps=num_warps, num_stages=num_stages)
    return out


# ---------------------------------------------------------------------------------------
# torch._scaled_mm where the arch has it
# ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _arch(index: int) -> tuple[str, tuple[int, int]]:
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0], (0, 0)
    return "", (props.major, props.minor)


def scaled_mm_supported(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor,
                        w_scale: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether torch._scaled_mm takes this problem on this device (no trial call)."""
    if not (a_q.is_cuda and hasattr(torch, "_scaled_mm")):
        return False
    m, k = a_q.shape
    n = w_q.shape[0]
    a_l, w_l = _a_layout(a_scale, m, k), _w_layout(w_scale, n, k)
    if a_l == "group" or w_l == "block" or k % 16 or n % 16:
        return False
    rowwise = a_l != "tensor" or w_l != "tensor"
    if rowwise and (a_l == "tensor" or w_l == "tensor" or out_dtype != torch.bfloat16):
        return False  # rowwise wants both sides rowwise
    gcn, cap = _arch(a_q.device.index or 0)
    if torch.version.hip:
        if rowwise:
            return gcn.startswith("gfx95")
        return gcn.startswith(("gfx94", "gfx95"))
    return cap >= (9, 0) if rowwise else cap >= (8, 9)


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
        return torch.ops.radiance.fp8_gemm(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if backend == "scaled_mm":
        return _scaled_mm(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if backend == "triton":
        return fp8_gemm_triton(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if backend == "reference":
        return fp8_gemm_reference(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


@torch.library.custom_op("radiance::fp8_gemm", mutates_args=())
def _fp8_gemm_op(a_q: torch.Tensor, a_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                 out_dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    if scaled_mm_supported(a_q, a_scale, w_q, w_scale, out_dtype):
        return _scaled_mm(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    if use_triton(a_q, w_q):
        return fp8_gemm_triton(a_q, a_scale, w_q, w_scale, out_dtype, bias)
    return fp8_gemm_reference(a_q, a_scale, w_q, w_scale, out_dtype, bias)


@_fp8_gemm_op.register_fake
def _(a_q, a_scale, w_q, w_scale, out_dtype, bias):
    _a_layout(a_scale, a_q.shape[0], a_q.shape[1])
    _w_layout(w_scale, w_q.shape[0], w_q.shape[1])
    return a_q.new_empty((a_q.shape[0], w_q.shape[0]), dtype=out_dtype)


# ---------------------------------------------------------------------------------------
# AOT: decode and prefill tiles, per-token x per-channel and per-group x block scales.
# ---------------------------------------------------------------------------------------

def _register_aot() -> None:
    if triton is None:
        return
    sig = {"a_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "sa_ptr": "*fp32", "sw_ptr": "*fp32",
           "bias_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "stride_sam": "i32", "stride_sak": "i32", "stride_swn": "i32", "stride_swk": "i32"}
    variants = {16: ((False, False), (True, True), (True, False)),   # decode tile
                4096: ((False, False), (True, True))}                  # prefill tile
    for m, layouts in variants.items():
        bm, bn, num_warps, num_stages = tile_config(m)
        for a_group, w_block in layouts:
            consts = {"A_GROUP": a_group, "W_BLOCK": w_block, "HAS_BIAS": False, "UPCAST": False,
                      "BM": bm, "BN": bn, "BK": GROUP}
            scales = "group-block" if w_block else "group-channel" if a_group else "token-channel"
            aot.register(aot.AotSpec(
                name=f"fp8_gemm[e4m3fn,{scales},BM{bm},BN{bn}]", feature="fp8_stream",
                kernel=_fp8_gemm_kernel, signature={**sig, **{c: "constexpr" for c in consts}},
                constexprs=consts, num_warps=num_warps, num_stages=num_stages))


_register_aot()
