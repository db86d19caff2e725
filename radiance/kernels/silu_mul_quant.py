"""Fused SiluAndMul + dynamic fp8 quantisation (one launch): the activation epilogue that
feeds a W8A8 down_proj its (q, scale) input directly.

``silu_mul_quant(gate_up, group_size=0, fp8_dtype=None) -> (q [M, N], scale)`` with
``gate_up`` [M, 2N] laid out as vLLM's MergedColumnParallelLinear produces it (gate first).

What stock computes (vLLM 0.32.0 ``SiluAndMul``, activation.py): ``F.silu(x[:, :N]) *
x[:, N:]`` in the activation dtype -- silu is evaluated in fp32 and rounded to bf16, the
product of two bf16 values is rounded to bf16 again (the CUDA ``silu_and_mul`` kernel
rounds at the same two points). Then ``QuantFP8`` as in add_rms_quant.py.

Rounding points, identical in the kernel and the reference: ``e = exp(-g)`` by our own
fp32 routine (Cody-Waite range reduction, degree-7 Horner polynomial, 2^n built from
bits: every step a plain IEEE add or multiply, so torch reproduces it; libm, Sleef and the
GPU's ex2.approx all differ in the last bit), ``silu = g / (1 + e)`` correctly rounded,
rounded to bf16; ``silu * up`` rounded to bf16; then the shared fp8 quantiser. Against
stock: the silu can differ by one bf16 ulp where the exps disagree in the last fp32 bit.
"""
from __future__ import annotations

import numpy as np
import torch

from . import fp8_common as fc
from .dispatch import use_triton

try:
    import triton
    import triton.language as tl

    from .fp8_common import quant_row, round_to
except ImportError:  # pragma: no cover
    triton = None
    tl = None


def _f32(x: float) -> float:
    """A Python float that is exactly an fp32 value: the same constant on both sides."""
    return float(np.float32(x))


LOG2E = _f32(1.4426950408889634)
LN2_HI = _f32(0.693145751953125)      # 16 significant bits: n * LN2_HI is exact for |n| < 256
LN2_LO = _f32(1.4286068203094172e-06)
EXP_C = tuple(_f32(1.0 / f) for f in (5040.0, 720.0, 120.0, 24.0, 6.0, 2.0))  # r^7 .. r^2
# exp's argument range: above, 2^n overflows; below, p * 2^n would go subnormal (flushed on
# some GPUs). silu(g) for |g| past these is g (or ~0) to far below bf16 resolution.
EXP_LO, EXP_HI = -80.0, 88.0


# ---------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------

def exp_reference(t: torch.Tensor) -> torch.Tensor:
    """exp of an fp32 tensor in exactly the kernel's operations (t clamped to [-80, 88])."""
    t = t.to(torch.float32).clamp(EXP_LO, EXP_HI)
    n = torch.floor(t * LOG2E + 0.5)
    r = (t - n * LN2_HI) - n * LN2_LO
    p = torch.full_like(r, EXP_C[0])
    for c in EXP_C[1:]:
        p = p * r + c
    p = p * r + 1.0
    p = p * r + 1.0
    two_n = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return p * two_n


def _round_bf16(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).to(torch.float32)


def silu_mul_reference_values(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in the activation dtype, with the kernel's rounding points."""
    n = gate_up.shape[-1] // 2
    g = gate_up[:, :n].to(torch.float32)
    u = gate_up[:, n:].to(torch.float32)
    silu = _round_bf16(fc.div_rn(g, 1.0 + exp_reference(-g)), gate_up.dtype)
    return (silu * u).to(gate_up.dtype)


def silu_mul_quant_reference(gate_up: torch.Tensor, group_size: int = 0,
                             fp8_dtype: torch.dtype | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, gate_up.device)
    _check(gate_up, group_size)
    return fc.quantize_reference(silu_mul_reference_values(gate_up), group_size, fp8_dtype)


def _check(gate_up: torch.Tensor, group_size: int) -> None:
    if gate_up.dim() != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must be [M, 2N], got {tuple(gate_up.shape)}")
    fc.check_group(group_size, gate_up.shape[1] // 2)


# ---------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------

if triton is not None:

    # Triton kernels only read module globals that are constexpr.
    _LOG2E = tl.constexpr(LOG2E)
    _LN2_HI = tl.constexpr(LN2_HI)
    _LN2_LO = tl.constexpr(LN2_LO)
    _C7, _C6, _C5, _C4, _C3, _C2 = (tl.constexpr(c) for c in EXP_C)
    _EXP_LO = tl.constexpr(EXP_LO)
    _EXP_HI = tl.constexpr(EXP_HI)

    @triton.jit
    def _exp_f32(t):
        t = tl.minimum(tl.maximum(t, _EXP_LO), _EXP_HI)
        n = tl.floor(t * _LOG2E + 0.5)
        r = (t - n * _LN2_HI) - n * _LN2_LO
        p = tl.zeros_like(r) + _C7
        p = p * r + _C6
        p = p * r + _C5
        p = p * r + _C4
        p = p * r + _C3
        p = p * r + _C2
        p = p * r + 1.0
        p = p * r + 1.0
        two_n = ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
        return p * two_n

    @triton.jit
    def _silu_mul_part(gu_ptr, row, N, OFF: tl.constexpr, BLOCK: tl.constexpr):
        cols = OFF + tl.arange(0, BLOCK)
        mask = cols < N
        act: tl.constexpr = gu_ptr.dtype.element_ty
        g = tl.load(gu_ptr + row * 2 * N + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * N + N + cols, mask=mask, other=0.0).to(tl.float32)
        silu = round_to(tl.math.div_rn(g, 1.0 + _exp_f32(-g)), act).to(tl.float32)
        return round_to(silu * u, act).to(tl.float32)

    @triton.jit
    def _silu_mul_quant_kernel(gu_ptr, q_ptr, s_ptr, N,
                               FMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                               GROUP: tl.constexpr, FNUZ: tl.constexpr,
                               BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
        # Two power-of-two parts instead of one padded block, as in add_rms_quant.
        row = tl.program_id(0).to(tl.int64)
        ha = _silu_mul_part(gu_ptr, row, N, 0, BLOCK_A)
        hb = ha  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            hb = _silu_mul_part(gu_ptr, row, N, BLOCK_A, BLOCK_B)
        quant_row(ha, hb, row, q_ptr, s_ptr, N, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK_A, BLOCK_B)


def silu_mul_quant_triton(gate_up: torch.Tensor, group_size: int = 0,
                          fp8_dtype: torch.dtype | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, gate_up.device)
    _check(gate_up, group_size)
    gate_up = gate_up.contiguous()
    m, n = gate_up.shape[0], gate_up.shape[1] // 2
    q = torch.empty((m, n), dtype=fp8_dtype, device=gate_up.device)
    scale = torch.empty(fc.scale_shape(m, n, group_size), dtype=torch.float32, device=gate_up.device)
    if m == 0:
        return q, scale
    block_a, block_b, _, num_warps = fc.launch_params(n)
    _silu_mul_quant_kernel[(m,)](gate_up, q.view(torch.uint8), scale, n, BLOCK_A=block_a,
                                 BLOCK_B=block_b, num_warps=num_warps, enable_fp_fusion=False,
                                 **fc.quant_constexprs(group_size, fp8_dtype))
    return q, scale


# ---------------------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------------------

@torch.library.custom_op("radiance::silu_mul_quant", mutates_args=())
def _silu_mul_quant_op(gate_up: torch.Tensor, group_size: int, fp8_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(gate_up):
        return silu_mul_quant_triton(gate_up, group_size, fp8_dtype)
    return silu_mul_quant_reference(gate_up, group_size, fp8_dtype)


@_silu_mul_quant_op.register_fake
def _(gate_up, group_size, fp8_dtype):
    _check(gate_up, group_size)
    m, n = gate_up.shape[0], gate_up.shape[1] // 2
    return (gate_up.new_empty((m, n), dtype=fp8_dtype),
            gate_up.new_empty(fc.scale_shape(m, n, group_size), dtype=torch.float32))


def silu_mul_quant(gate_up: torch.Tensor, group_size: int = 0,
                   fp8_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, N] fp8, scale [M, 1] or [M, N/128] fp32) of silu(gate) * up."""
    return torch.ops.radiance.silu_mul_quant(
        gate_up, int(group_size), fc.resolve_fp8_dtype(fp8_dtype, gate_up.device))


class SiluMulQuant(torch.nn.Module):
    """Drop-in for an MLP's SiluAndMul whose down_proj takes a (q, scale) input."""

    def __init__(self, group_size: int = 0, fp8_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.group_size = group_size
        self.fp8_dtype = fp8_dtype

    def forward(self, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return silu_mul_quant(gate_up, self.group_size, self.fp8_dtype)


# No AOT launches: the fp8-stream contract does not wire this epilogue (radiance/fp8_stream), so
# no shipped profile launches it; its tests compile it for the HIP targets.
