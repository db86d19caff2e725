"""Dynamic fp8 quantisation of an activation in one launch: ``quant_fp8(x, group_size=0,
fp8_dtype=None) -> (q [M, K], scale [M, 1] or [M, K/128])``.

The quant half of ``add_rms_quant`` on its own, for the W8A8 linears of ``radiance_fp8`` that
are handed a plain tensor (every input no epilogue produces: o_proj, down_proj, GDN out_proj,
and all of them when fp8-stream is off). The arithmetic is ``quantize_reference``'s (vLLM's
QuantFP8.forward_native: amax, ``scale = max(amax / FP8_MAX, min)``, ``1 / scale`` correctly
rounded, multiply, clamp, round to nearest even), so the codes and scales are the reference's
bit for bit; the reference is the CPU implementation. On a GPU the reference costs about a
dozen launches per call, two of them float64 divisions, which is why this kernel exists.
"""
from __future__ import annotations

import torch

import functools

from . import aot, shipped
from . import fp8_common as fc
from .dispatch import DeviceInfo, describe, eager_gpu_call, plan_cache, register_library_op

try:
    import triton
    import triton.language as tl

    from .fp8_common import group_quant_store, quant_row, row_cols
except ImportError:  # pragma: no cover - CPU images without Triton
    triton = None
    tl = None


if triton is not None:

    @triton.jit
    def _load_part(x_ptr, row, stride, K, OFF: tl.constexpr, BLOCK: tl.constexpr):
        cols = row_cols(OFF, BLOCK)
        return tl.load(x_ptr + row * stride + cols, mask=cols < K, other=0.0).to(tl.float32)

    @triton.jit
    def _quant_fp8_kernel(x_ptr, q_ptr, s_ptr, K, stride,
                          FMAX: tl.constexpr, MIN_SCALE: tl.constexpr, GROUP: tl.constexpr,
                          FNUZ: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                          HW_FP8: tl.constexpr = False):
        # Rows held as add_rms_quant holds them ([BLOCK / 8, 8], two power-of-two parts), so the
        # shared quantiser stores codes in the layout the loads took.
        row = tl.program_id(0).to(tl.int64)
        xa = _load_part(x_ptr, row, stride, K, 0, BLOCK_A)
        xb = xa  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            xb = _load_part(x_ptr, row, stride, K, BLOCK_A, BLOCK_B)
        quant_row(xa, xb, row, q_ptr, s_ptr, K, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK_A, BLOCK_B,
                   HW_FP8)

    @triton.jit
    def _quant_fp8_group_kernel(x_ptr, q_ptr, s_ptr, K, stride,
                                FMAX: tl.constexpr, MIN_SCALE: tl.constexpr, GROUP: tl.constexpr,
                                FNUZ: tl.constexpr, BLOCK: tl.constexpr,
                                HW_FP8: tl.constexpr = False):
        # Groups are independent, so a row is split over programs (BLOCK // GROUP groups each):
        # one program per row left prefill-sized batches with wide rows slower than
        # torch.compile (docs/benchmarks.md).
        row = tl.program_id(0).to(tl.int64)
        off = tl.program_id(1) * BLOCK
        cols = off + row_cols(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < K, other=0.0).to(tl.float32)
        group_quant_store(x, row, q_ptr, s_ptr, K, off, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK, HW_FP8)


GROUP_BLOCK = 1024  # columns per program of the group kernel (8 groups of 128)


def _check(x: torch.Tensor, group_size: int) -> None:
    if x.dim() != 2:
        raise ValueError(f"quant_fp8 takes [M, K], got {tuple(x.shape)}")
    fc.check_group(group_size, x.shape[1])


_PLANS: dict[tuple, tuple[dict, int, bool]] = plan_cache()


def _plan(k: int, group_size: int, fp8_dtype: torch.dtype, device: torch.device):
    key = (k, group_size, fp8_dtype, device)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = launch_plan(k, group_size, fp8_dtype, describe(device))
    return plan


def launch_plan(k: int, group_size: int, fp8_dtype: torch.dtype, dev: DeviceInfo
                ) -> tuple[dict, int, bool]:
    """(constexprs, num_warps, codes as uint8) of the launch for rows of k on ``dev``."""
    if fp8_dtype not in fc.FP8_DTYPES:
        raise ValueError(f"fp8_dtype must be one of {fc.FP8_DTYPES}, got {fp8_dtype}")
    consts = {**fc.quant_constexprs(group_size, fp8_dtype), "HW_FP8": fc.native_constexprs(dev, fp8_dtype)["HW_FP8"]}
    if group_size:
        consts["BLOCK"], num_warps = GROUP_BLOCK, 4
    else:
        block_a, block_b, _, num_warps = fc.launch_params(k)
        consts.update(BLOCK_A=block_a, BLOCK_B=block_b)
    return consts, num_warps, fc.codes_as_bytes(fp8_dtype, dev)


def quant_fp8_triton(x: torch.Tensor, group_size: int = 0, fp8_dtype: torch.dtype | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, x.device)
    _check(x, group_size)
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    consts, num_warps, as_bytes = _plan(k, group_size, fp8_dtype, x.device)
    q = torch.empty((m, k), dtype=fp8_dtype, device=x.device)
    scale = torch.empty(fc.scale_shape(m, k, group_size), dtype=torch.float32, device=x.device)
    if m:
        kernel, grid = ((_quant_fp8_group_kernel, (m, triton.cdiv(k, GROUP_BLOCK))) if group_size
                        else (_quant_fp8_kernel, (m,)))
        kernel[grid](x, q.view(torch.uint8) if as_bytes else q, scale, k, x.stride(0),
                     num_warps=num_warps, enable_fp_fusion=False, **consts)
    return q, scale


# Library-registered (see add_rms_quant.py): this sits in front of every plain-tensor W8A8 linear.

def _quant_fp8_gpu(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is None:
        return _quant_fp8_cpu(x, group_size, fp8_dtype)
    return quant_fp8_triton(x, group_size, fp8_dtype)


def _quant_fp8_cpu(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, group_size)
    return fc.quantize_reference(x, group_size, fp8_dtype)


def _quant_fp8_fake(x, group_size, fp8_dtype):
    _check(x, group_size)
    m, k = x.shape
    return (x.new_empty((m, k), dtype=fp8_dtype),
            x.new_empty(fc.scale_shape(m, k, group_size), dtype=torch.float32))


_OP = register_library_op("quant_fp8", _quant_fp8_cpu, _quant_fp8_gpu, _quant_fp8_fake)


def quant_fp8(x: torch.Tensor, group_size: int = 0, fp8_dtype: torch.dtype | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, K] fp8, scale [M, 1] or [M, K/128] fp32) of ``x`` [M, K], as quantize_reference."""
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, x.device)
    if eager_gpu_call(x):
        return quant_fp8_triton(x, int(group_size), fp8_dtype)
    return _OP(x, int(group_size), fp8_dtype)


# AOT: the plain-tensor inputs of the fp8-stream profiles' W8A8 linears (radiance.kernels.aot).

def _aot_launches(dev: DeviceInfo, arch: str):
    if not dev.has_fp8:
        return
    for k in shipped.QUANT_FP8_K:
        for group in shipped.FP8_GROUPS:
            yield f"K={k} group={group}", functools.partial(_aot_call, k, group)


def _aot_call(k: int, group: int) -> None:
    quant_fp8_triton(torch.empty((1, k), dtype=torch.bfloat16), group)


if triton is not None:
    aot.register("quant_fp8", "fp8_stream", _aot_launches)
