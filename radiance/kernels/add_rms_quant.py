"""Fused residual add + Qwen3-Next RMSNorm + dynamic fp8 quantisation (one launch).

``add_rms_quant(y, residual, weight, eps, group_size=0, fp8_dtype=None)
-> (q, scale, new_residual)`` replaces, at every RowParallel site of the fp8-stream
contract, the stock chain ``all-reduce -> GemmaRMSNorm(y, residual) -> QuantFP8``.

What the stock norm computes (vLLM 0.32.0, read from the installed package):

* ``qwen3_next.py`` imports ``GemmaRMSNorm as Qwen3NextRMSNorm`` (layers/layernorm.py) for
  input_layernorm, post_attention_layernorm and model.norm. Its weight is a Gemma-style
  *offset*: the parameter is created as zeros in the model dtype (bf16) and applied as
  ``1 + w``. ``forward_native`` (also what forward_cuda runs) builds
  ``weight = self.weight.float() + 1.0`` -- the +1 happens in fp32, never in bf16 -- and
  calls ``ir.ops.fused_add_rms_norm(x, residual, weight, eps)``.
* ``vllm/ir/ops/layernorm.py`` fused_add_rms_norm (native impl): ``s = x.f32 + residual.f32``;
  the new residual is ``s.to(x.dtype)`` -- kept in the *activation* dtype, whatever dtype
  the incoming residual had; the variance is taken from the *unrounded* fp32 sum
  (``s.pow(2).mean(-1)``), then ``s * rsqrt(var + eps)``, then ``.to(weight.dtype) * weight``
  (an fp32 multiply, the weight being fp32), and only then ``.to(x.dtype)``.
* The dtype trap: the compiled C kernels (``vllm_c`` impl) only accept ``weight.dtype ==
  x.dtype``; the fp32 Gemma weight routes the norm to the native path. Fusions that ignored
  this fed an fp32 weight into a bf16 kernel (vLLM PR #44694 for fused_add_rms_norm + block
  quant; issue #48324, FlashInfer AR + residual RMSNorm + quant corrupting output with fp32
  norm weights). Here the weight is read in whatever dtype it has and widened to fp32 in the
  kernel; nothing assumes it matches ``y``.
* The quant that follows (QuantFP8.forward_native, input_quant_fp8.py): per token
  ``scale = max(amax / FP8_MAX, 1 / (FP8_MAX * 512))``, ``q = clamp(x.f32 * (1 / scale))``,
  with FP8_MAX 448 for float8_e4m3fn and 224 (not 240) for float8_e4m3fnuz, as vLLM uses on
  ROCm. Per group of 128: the same per (row, group); K must be a multiple of the group.

Rounding points, identical in the Triton kernel and in ``add_rms_quant_reference``:
fp32 sum ``y + r``; the residual rounded once to y.dtype; squares in fp32; their sum
*order-free*: each square is scaled by a power of two chosen from the row's largest square
(so the total cannot overflow) and truncated to int64, the int64s are summed (integer
addition is associative, so the GPU's reduction tree does not matter), and the total is
converted back (round to nearest) and unscaled -- deterministic on every backend and more
accurate than an fp32 tree; ``/ K``, ``sqrt`` and ``1 / sqrt`` correctly rounded (the
kernel uses ``div_rn``/``sqrt_rn``; the reference goes through float64 and rounds once,
which is exact for these ops: torch.rsqrt, Triton's rsqrt, MKL's vectorised sqrt on CPU
and CUDA's division of a tensor by a CPU scalar are all off by an ulp now and then);
``* rstd``, ``* (w.f32 + 1)``, rounded to y.dtype (the normed activation the stock linear
would see); amax, scale, reciprocal, multiply, clamp, round-to-nearest-even to fp8. The
kernel is compiled with fp fusion off (no mul+add contracted into an fma behind our back).
Where the conversions were checked bit for bit on the GPU (NVIDIA) it rounds to bf16 with
the compiler's RTNE conversion and, for e4m3fn on sm_89+, encodes fp8 with the hardware
cvt.rn.satfinite; elsewhere (ROCm, not run yet; the interpreter, which truncates) it rounds
on the bits and encodes fp8 with integer arithmetic (float8e4b8 has no NVIDIA instruction).

Per token the kernel needs two block reductions, not three: the max square (for the sum's
scale) is reduced together with max |s| * |1 + w|, from which the amax of the normed row
follows exactly in all but about one row in 2^11 (see _token_amax; those rows, and all-zero,
inf or NaN rows, take the exact reduction). The result is the reference's, bit for bit.

Against stock the only intended differences are the last bit of ``rsqrt`` and of the
variance sum: outputs agree with the stock chain to within one bf16 ulp of the normed
activation (tests/radiance/kernels/test_add_rms_quant.py checks it).
"""
from __future__ import annotations

import functools

import torch

from . import aot, shipped
from . import fp8_common as fc
from .dispatch import (
    DeviceInfo,
    describe,
    eager_gpu_call,
    fp8_dtype_for_device,
    plan_cache,
    register_library_op,
)

try:  # Triton is optional: the reference runs everywhere.
    import triton
    import triton.language as tl

    from .fp8_common import pow2, quant_row, round_to, row_cols, sumsq_scale, token_quant_store
except ImportError:  # pragma: no cover - CPU images without Triton
    triton = None
    tl = None


# ---------------------------------------------------------------------------------------
# PyTorch reference (runs on any device; the op's CPU implementation)
# ---------------------------------------------------------------------------------------

def add_rms_quant_reference(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float, group_size: int = 0,
                            fp8_dtype: torch.dtype | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, y.device)
    fc.check_group(group_size, y.shape[1])
    normed, new_residual = add_rms_norm_reference(y, residual, weight, eps)
    q, scale = fc.quantize_reference(normed, group_size, fp8_dtype)
    return q, scale, new_residual


def add_rms_norm_reference(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm half of the reference: (normed, new_residual), both in y.dtype."""
    k = y.shape[-1]
    s = y.to(torch.float32) + residual.to(torch.float32)
    new_residual = s.to(y.dtype)
    var = fc.div_rn(fc.exact_sumsq(s * s, fc.sum_log2(k)), k)
    rstd = fc.div_rn(torch.ones_like(var), fc.sqrt_rn(var + eps))
    w1 = weight.to(torch.float32) + 1.0
    normed = ((s * rstd.unsqueeze(-1)) * w1).to(y.dtype)
    return normed, new_residual


# ---------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------

if triton is not None:

    _HUGE = tl.constexpr(1.7014118346046923e+38)  # 2^127: "no prediction" marker of _probe

    @triton.jit
    def _fixed(sq, f):
        return tl.sum((sq * pow2(f)).to(tl.int64))

    @triton.jit
    def _max2(a0, a1, b0, b1):
        return tl.maximum(a0, b0), tl.maximum(a1, b1)

    @triton.jit
    def _max2_all(a, b):
        """(max a, max b) over a whole row part in one reduction (shared barriers)."""
        if len(a.shape) == 2:
            a, b = tl.reduce((a, b), 1, _max2)
        return tl.reduce((a, b), 0, _max2)

    @triton.jit
    def _probe(s, w1):
        """|s| * |1 + w|, the pre-rstd magnitude whose row max predicts the normed row's amax
        (see _token_amax); 2^127 where |1 + w| is so large that a subnormal s * rstd could carry
        an error the prediction does not bound, which forces the exact reduction."""
        c = tl.abs(w1)
        return tl.where(c < 1048576.0, tl.abs(s) * c, _HUGE)

    @triton.jit
    def _token_amax(xa, xb, rstd, tmax, act: tl.constexpr, BLOCK_B: tl.constexpr,
                    NATIVE: tl.constexpr):
        """max |normed| of a row without a third block reduction in the common case.

        normed_i = act(p_i), p_i = fl(fl(|s_i| * rstd) * |w1_i|), and amax = act(max p_i)
        (rounding is monotone). With t_i = fl(|s_i| * |w1_i|), T = max t_i and E = fl(rstd * T),
        every rounding is relative (|delta| <= u = 2^-24, no subnormals: E in [2^-100, 2^100],
        |w1| < 2^20, T < 2^127) so max p_i lies in [E (1 - 5u), E (1 + 5u)]. When act() maps the wider
        interval [E (1 - 2^-20), E (1 + 2^-20)] to one value, that value is amax, bit for bit;
        otherwise (about one row in 2^11, and zero/inf/NaN rows) the exact reduction runs."""
        e = rstd * tmax
        lo = round_to(e * (1.0 - 9.5367431640625e-07), act, NATIVE).to(tl.float32)
        hi = round_to(e * (1.0 + 9.5367431640625e-07), act, NATIVE).to(tl.float32)
        amax = lo
        if (lo != hi) | (e < 7.888609052210118e-31) | (e > 1.2676506002282294e+30) | (tmax >= _HUGE):
            amax = tl.max(tl.abs(xa))
            if BLOCK_B > 0:
                amax = tl.maximum(amax, tl.max(tl.abs(xb)))
        return amax

    @triton.jit
    def _add_part(y_ptr, r_ptr, ro_ptr, row, K, OFF: tl.constexpr, BLOCK: tl.constexpr,
                  NATIVE: tl.constexpr = False):
        """s = y + r over [OFF, OFF + BLOCK) in fp32; stores the rounded new residual."""
        cols = row_cols(OFF, BLOCK)
        mask = cols < K
        y = tl.load(y_ptr + row * K + cols, mask=mask, other=0.0)
        r = tl.load(r_ptr + row * K + cols, mask=mask, other=0.0)
        s = y.to(tl.float32) + r.to(tl.float32)
        tl.store(ro_ptr + row * K + cols, round_to(s, ro_ptr.dtype.element_ty, NATIVE), mask=mask)
        return s

    @triton.jit
    def _w1_part(w_ptr, K, OFF: tl.constexpr, BLOCK: tl.constexpr, TWO_D: tl.constexpr = True):
        """1 + w in fp32 (the Gemma offset is added in fp32, never in the weight's dtype)."""
        cols = row_cols(OFF, BLOCK, TWO_D)
        return tl.load(w_ptr + cols, mask=cols < K, other=0.0).to(tl.float32) + 1.0

    @triton.jit
    def _rms_quant_core(sa, sb, w1a, w1b, row, q_ptr, s_ptr, K, eps, FMAX: tl.constexpr,
                        MIN_SCALE: tl.constexpr, GROUP: tl.constexpr, FNUZ: tl.constexpr,
                        BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, LOG2: tl.constexpr,
                        act: tl.constexpr, NATIVE: tl.constexpr, HW_FP8: tl.constexpr):
        """RMSNorm + fp8 quant of one row held as two parts in fp32 (sa, then sb when
        BLOCK_B > 0), with 1 + w already loaded (w1a, w1b): two block reductions per token
        (max square with the amax probe, then the fixed-point sum), one per group."""
        sqa = sa * sa
        sqb = sqa  # placeholder when there is no second part (never read)
        tmax = 0.0
        if GROUP == 0:
            mx, tmax = _max2_all(sqa, _probe(sa, w1a))
            if BLOCK_B > 0:
                sqb = sb * sb
                mxb, tmaxb = _max2_all(sqb, _probe(sb, w1b))
                mx = tl.maximum(mx, mxb)
                tmax = tl.maximum(tmax, tmaxb)
        else:
            mx = tl.max(sqa)
            if BLOCK_B > 0:
                sqb = sb * sb
                mx = tl.maximum(mx, tl.max(sqb))
        f = sumsq_scale(mx, LOG2)
        total = _fixed(sqa, f)
        if BLOCK_B > 0:
            total += _fixed(sqb, f)
        sumsq = total.to(tl.float32) * pow2(-f)
        var = tl.math.div_rn(sumsq, tl.cast(K, tl.float32))
        rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(var + eps))
        xa = round_to((sa * rstd) * w1a, act, NATIVE).to(tl.float32)
        xb = xa  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            xb = round_to((sb * rstd) * w1b, act, NATIVE).to(tl.float32)
        if GROUP == 0:
            amax = _token_amax(xa, xb, rstd, tmax, act, BLOCK_B, NATIVE)
            token_quant_store(xa, xb, amax, row, q_ptr, s_ptr, K, FMAX, MIN_SCALE, FNUZ,
                               BLOCK_A, BLOCK_B, HW_FP8)
        else:
            quant_row(xa, xb, row, q_ptr, s_ptr, K, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK_A,
                       BLOCK_B, HW_FP8)

    @triton.jit
    def norm_quant_row(sa, sb, row, w_ptr, q_ptr, s_ptr, K, eps, FMAX: tl.constexpr,
                        MIN_SCALE: tl.constexpr, GROUP: tl.constexpr, FNUZ: tl.constexpr,
                        BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, LOG2: tl.constexpr,
                        act: tl.constexpr, NATIVE: tl.constexpr = False,
                        HW_FP8: tl.constexpr = False):
        """RMSNorm + fp8 quant of one row held as two parts (sa, then sb when BLOCK_B > 0), in
        fp32; shared by this kernel and the fused two-rank all-reduce epilogue."""
        TWO_D: tl.constexpr = len(sa.shape) == 2
        w1a = _w1_part(w_ptr, K, 0, BLOCK_A, TWO_D)
        w1b = w1a  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            w1b = _w1_part(w_ptr, K, BLOCK_A, BLOCK_B, TWO_D)
        _rms_quant_core(sa, sb, w1a, w1b, row, q_ptr, s_ptr, K, eps, FMAX, MIN_SCALE, GROUP, FNUZ,
                        BLOCK_A, BLOCK_B, LOG2, act, NATIVE, HW_FP8)

    @triton.jit
    def _add_rms_quant_kernel(y_ptr, r_ptr, w_ptr, q_ptr, s_ptr, ro_ptr, K, eps,
                              FMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                              GROUP: tl.constexpr, FNUZ: tl.constexpr,
                              BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, LOG2: tl.constexpr,
                              NATIVE: tl.constexpr = False, HW_FP8: tl.constexpr = False):
        # The row is split into two power-of-two parts (5120 = 4096 + 1024) instead of one
        # padded block (8192): masked lanes cost the same instructions as live ones. The
        # weight is loaded with the activations, before the first reduction, so its latency
        # is not on the critical path.
        row = tl.program_id(0).to(tl.int64)
        act: tl.constexpr = y_ptr.dtype.element_ty
        w1a = _w1_part(w_ptr, K, 0, BLOCK_A)
        sa = _add_part(y_ptr, r_ptr, ro_ptr, row, K, 0, BLOCK_A, NATIVE)
        sb = sa  # placeholders when there is no second part (never read)
        w1b = w1a
        if BLOCK_B > 0:
            w1b = _w1_part(w_ptr, K, BLOCK_A, BLOCK_B)
            sb = _add_part(y_ptr, r_ptr, ro_ptr, row, K, BLOCK_A, BLOCK_B, NATIVE)
        _rms_quant_core(sa, sb, w1a, w1b, row, q_ptr, s_ptr, K, eps, FMAX, MIN_SCALE, GROUP, FNUZ,
                        BLOCK_A, BLOCK_B, LOG2, act, NATIVE, HW_FP8)


def kernel_warps(k: int) -> int:
    """num_warps of _add_rms_quant_kernel: launch_params' choice, except 8 (not 4) for rows of
    1025..2048 lanes -- on the H200 at M=8, K=2048: 2.11 us against 2.53 (graph mode, same
    run, docs/benchmarks.md); at K=5120 4, 8 and 16 warps measured the same."""
    a, b, _, num_warps = fc.launch_params(k)
    return 8 if 1024 < a + b <= 2048 else num_warps


# num_warps of _add_rms_quant_kernel by padded row width (absent: kernel_warps' choice): a
# knob for the benchmark's sweep (set it before the first call of a shape; plans are cached).
WARPS_OVERRIDE: dict[int, int] = {}


class _Plan:
    """Everything about a launch that depends only on (K, group, dtypes, device), validated
    once: a call then costs three allocations and one JIT launch. (Calling the compiled
    kernel's launcher directly, past the JIT's argument specialisation, measured no faster on
    the H200's host with Triton 3.6 -- docs/benchmarks.md -- so the JIT launch stays.)"""

    __slots__ = ("consts", "k", "num_warps", "q_as_bytes", "scale_cols")

    def __init__(self, k: int, group_size: int, fp8_dtype: torch.dtype, dev: DeviceInfo):
        fc.check_group(group_size, k)
        if fp8_dtype not in fc.FP8_DTYPES:
            raise ValueError(f"fp8_dtype must be one of {fc.FP8_DTYPES}, got {fp8_dtype}")
        block_a, block_b, log2, _ = fc.launch_params(k)
        self.k = k
        self.scale_cols = k // group_size if group_size else 1
        self.consts = {**fc.quant_constexprs(group_size, fp8_dtype), "BLOCK_A": block_a,
                       "BLOCK_B": block_b, "LOG2": log2, **fc.native_constexprs(dev, fp8_dtype)}
        self.num_warps = WARPS_OVERRIDE.get(block_a + block_b, kernel_warps(k))
        self.q_as_bytes = fc.codes_as_bytes(fp8_dtype, dev)

    def launch(self, m, y, residual, weight, q, scale, new_residual, eps):
        if self.q_as_bytes:
            q = q.view(torch.uint8)
        _add_rms_quant_kernel[(m,)](
            y, residual, weight, q, scale, new_residual, self.k, eps, num_warps=self.num_warps,
            enable_fp_fusion=False, **self.consts)


_PLANS: dict[tuple, _Plan] = plan_cache()


def add_rms_quant_triton(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float, group_size: int = 0, fp8_dtype: torch.dtype | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = y.shape
    device = y.device
    if fp8_dtype is None:
        fp8_dtype = fp8_dtype_for_device(device)
    key = (k, group_size, fp8_dtype, y.dtype, residual.dtype, weight.dtype, device)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _Plan(k, group_size, fp8_dtype, describe(device))
    if residual.shape != y.shape or weight.shape != (k,):
        raise ValueError(f"residual {tuple(residual.shape)} and weight {tuple(weight.shape)} do not "
                         f"match y {tuple(y.shape)}")
    if not y.is_contiguous():
        y = y.contiguous()
    if not residual.is_contiguous():
        residual = residual.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    q = torch.empty((m, k), dtype=fp8_dtype, device=device)
    scale = torch.empty((m, plan.scale_cols), dtype=torch.float32, device=device)
    new_residual = torch.empty((m, k), dtype=y.dtype, device=device)
    if m:
        plan.launch(m, y, residual, weight, q, scale, new_residual, float(eps))
    return q, scale, new_residual


# ---------------------------------------------------------------------------------------
# The op (dispatch.register_library_op, which says why torch.library.Library)
# ---------------------------------------------------------------------------------------


def _add_rms_quant_gpu(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       group_size: int, fp8_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if triton is None:
        return add_rms_quant_reference(y, residual, weight, eps, group_size, fp8_dtype)
    return add_rms_quant_triton(y, residual, weight, eps, group_size, fp8_dtype)


def _add_rms_quant_cpu(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       group_size: int, fp8_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return add_rms_quant_reference(y, residual, weight, eps, group_size, fp8_dtype)


def _add_rms_quant_fake(y, residual, weight, eps, group_size, fp8_dtype):
    fc.check_group(group_size, y.shape[1])
    m, k = y.shape
    return (y.new_empty((m, k), dtype=fp8_dtype),
            y.new_empty(fc.scale_shape(m, k, group_size), dtype=torch.float32),
            y.new_empty((m, k)))


_OP = register_library_op("add_rms_quant", _add_rms_quant_cpu, _add_rms_quant_gpu, _add_rms_quant_fake)


def add_rms_quant(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  group_size: int = 0, fp8_dtype: torch.dtype | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [M, K] fp8, scale [M, 1] or [M, K/128] fp32, new_residual [M, K] y.dtype)."""
    if fp8_dtype is None:
        fp8_dtype = fp8_dtype_for_device(y.device)
    if eager_gpu_call(y, residual, weight):
        return add_rms_quant_triton(y, residual, weight, float(eps), int(group_size), fp8_dtype)
    return _OP(y, residual, weight, float(eps), int(group_size), fp8_dtype)


# ---------------------------------------------------------------------------------------
# AOT: the fp8-stream profiles' hidden size, both activation-scale modes, the device's fp8 format
# (radiance.kernels.aot).
# ---------------------------------------------------------------------------------------

def _aot_launches(dev: DeviceInfo, arch: str):
    if not dev.has_fp8:
        return
    k = shipped.FP8_HIDDEN
    for group in shipped.FP8_GROUPS:
        yield f"K={k} group={group}", functools.partial(_aot_call, k, group)


def _aot_call(k: int, group: int) -> None:
    y = torch.empty((1, k), dtype=torch.bfloat16)
    add_rms_quant_triton(y, torch.empty_like(y), torch.empty(k, dtype=torch.bfloat16), 1e-6, group)


if triton is not None:
    aot.register("add_rms_quant", "fp8_stream", _aot_launches)
