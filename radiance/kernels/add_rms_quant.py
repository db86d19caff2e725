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
kernel is compiled with fp fusion off (no mul+add contracted into an fma behind our back)
and encodes fp8 with integer arithmetic, so the codes do not depend on a conversion
instruction the arch may or may not have (float8e4b8 has none on NVIDIA).

Against stock the only intended differences are the last bit of ``rsqrt`` and of the
variance sum: outputs agree with the stock chain to within one bf16 ulp of the normed
activation (tests/radiance/kernels/test_add_rms_quant.py checks it).
"""
from __future__ import annotations

import torch

from . import aot
from .dispatch import fp8_dtype_for_device, use_triton

try:  # Triton is optional: the reference runs everywhere.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU images without Triton
    triton = None
    tl = None

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# vLLM's get_fp8_min_max(): 224 for fnuz because 240 costs accuracy with dynamic scales.
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0}
SUPPORTED_GROUPS = (0, 128)  # 0: one scale per token


def fp8_max(fp8_dtype: torch.dtype) -> float:
    return FP8_MAX[fp8_dtype]


def min_scale(fp8_dtype: torch.dtype) -> float:
    """vLLM's floor on a dynamic scale, so an all-zero row still gets a finite 1/scale."""
    return 1.0 / (FP8_MAX[fp8_dtype] * 512.0)


def resolve_fp8_dtype(fp8_dtype: torch.dtype | None, device: torch.device) -> torch.dtype:
    dt = fp8_dtype_for_device(device) if fp8_dtype is None else fp8_dtype
    if dt not in FP8_DTYPES:
        raise ValueError(f"fp8_dtype must be one of {FP8_DTYPES}, got {dt}")
    return dt


def check_group(group_size: int, k: int) -> None:
    if group_size not in SUPPORTED_GROUPS:
        raise ValueError(f"group_size must be one of {SUPPORTED_GROUPS} (0 = per token), got {group_size}")
    if group_size and k % group_size:
        raise ValueError(f"K={k} is not a multiple of group_size={group_size}")


def scale_shape(m: int, k: int, group_size: int) -> tuple[int, int]:
    return (m, k // group_size) if group_size else (m, 1)


# ---------------------------------------------------------------------------------------
# PyTorch reference (runs on any device; the op's CPU implementation)
# ---------------------------------------------------------------------------------------

def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def sum_log2(k: int) -> int:
    """log2 of the padded row width the kernel reduces over (sets the int64 headroom)."""
    return triton_next_pow2(max(k, 128)).bit_length() - 1


def pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """2^e as fp32 for int32 e in [-126, 127], built from the bits like the kernel does."""
    return ((e + 127) << 23).view(torch.float32)


def exact_sumsq(sq: torch.Tensor, log2: int) -> torch.Tensor:
    """Order-free sum over the last dim of non-negative fp32 ``sq`` (see the module doc)."""
    mx = sq.amax(dim=-1)
    e = ((mx.view(torch.int32) >> 23) & 0xFF) - 127
    f = (62 - log2 - e).clamp(-126, 126)
    total = (sq * pow2_f32(f).unsqueeze(-1)).to(torch.int64).sum(dim=-1)
    return total.to(torch.float32) * pow2_f32(-f)


def div_rn(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    """Correctly rounded fp32 a / b on any device (float64 holds the exact quotient well
    enough that one rounding to fp32 is the IEEE result)."""
    b = b.double() if isinstance(b, torch.Tensor) else float(b)
    return (a.double() / b).to(torch.float32)


def sqrt_rn(a: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(a.double()).to(torch.float32)


def quantize_reference(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """QuantFP8.forward_native's arithmetic on [M, K] -> (codes [M, K], scales [M, K//G or 1])."""
    m, k = x.shape
    fmax = FP8_MAX[fp8_dtype]
    xf = x.to(torch.float32)
    xg = xf.view(m, k // group_size, group_size) if group_size else xf.view(m, 1, k)
    amax = xg.abs().amax(dim=-1)
    scale = div_rn(amax, fmax).clamp(min=min_scale(fp8_dtype))
    inv = div_rn(torch.ones_like(scale), scale)
    q = (xg * inv.unsqueeze(-1)).clamp(-fmax, fmax).to(fp8_dtype)
    return q.view(m, k), scale


def add_rms_quant_reference(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float, group_size: int = 0,
                            fp8_dtype: torch.dtype | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fp8_dtype = resolve_fp8_dtype(fp8_dtype, y.device)
    check_group(group_size, y.shape[1])
    normed, new_residual = add_rms_norm_reference(y, residual, weight, eps)
    q, scale = quantize_reference(normed, group_size, fp8_dtype)
    return q, scale, new_residual


def add_rms_norm_reference(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The norm half of the reference: (normed, new_residual), both in y.dtype."""
    k = y.shape[-1]
    s = y.to(torch.float32) + residual.to(torch.float32)
    new_residual = s.to(y.dtype)
    var = div_rn(exact_sumsq(s * s, sum_log2(k)), k)
    rstd = div_rn(torch.ones_like(var), sqrt_rn(var + eps))
    w1 = weight.to(torch.float32) + 1.0
    normed = ((s * rstd.unsqueeze(-1)) * w1).to(y.dtype)
    return normed, new_residual


# ---------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _fp8_encode(v, FNUZ: tl.constexpr):
        """fp32 (already clamped to the format's range) -> e4m3 bit pattern, round to
        nearest even, in integer arithmetic so every backend produces the same byte."""
        BIAS: tl.constexpr = 8 if FNUZ else 7
        bits = v.to(tl.uint32, bitcast=True)
        sign = bits >> 31
        a = bits & 0x7FFFFFFF
        e = (a >> 23).to(tl.int32) - 127
        # Below the format's smallest normal exponent the quantum stays fixed (subnormals).
        big_e = tl.maximum(e, 1 - BIAS)
        mant = (a & 0x7FFFFF) | 0x800000
        # |v| / 2^(big_e - 3) = mant >> sh, sh >= 20; past 31 the result is 0 anyway.
        sh = tl.minimum(20 + big_e - e, 31).to(tl.uint32)
        lsb = (mant >> sh) & 1
        n = (mant + ((1 << (sh - 1)) - 1) + lsb) >> sh
        code = (big_e - (1 - BIAS)).to(tl.uint32) * 8 + n
        if FNUZ:  # fnuz has no negative zero: 0x80 is its NaN
            sign = tl.where(code == 0, 0, sign)
        return (code | (sign << 7)).to(tl.uint8)

    @triton.jit
    def _round_to(x, dtype: tl.constexpr):
        """fp32 -> ``dtype`` round to nearest even. bf16 is rounded on the bits first: the
        conversion is then exact everywhere, the interpreter's (which truncates) included."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
        return x.to(dtype)

    @triton.jit
    def _pow2(e):
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _sumsq_scale(mx, LOG2: tl.constexpr):
        """The power of two f of exact_sumsq(): the largest square scaled stays < 2^(63-LOG2)."""
        e = ((mx.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
        return tl.minimum(tl.maximum(62 - LOG2 - e, -126), 126)

    @triton.jit
    def _fixed(sq, f):
        return tl.sum((sq * _pow2(f)).to(tl.int64), axis=0)

    @triton.jit
    def _encode_store(xf, inv, row, q_ptr, K, OFF: tl.constexpr, FMAX: tl.constexpr,
                      FNUZ: tl.constexpr, BLOCK: tl.constexpr):
        cols = OFF + tl.arange(0, BLOCK)
        v = tl.minimum(tl.maximum(xf * inv, -FMAX), FMAX)
        tl.store(q_ptr + row * K + cols, _fp8_encode(v, FNUZ), mask=cols < K)

    @triton.jit
    def _token_scale(amax, FMAX: tl.constexpr, MIN_SCALE: tl.constexpr):
        scale = tl.maximum(tl.math.div_rn(amax, FMAX), MIN_SCALE)
        return scale, tl.math.div_rn(1.0, scale)

    @triton.jit
    def _group_quant_store(xf, row, q_ptr, s_ptr, K, OFF: tl.constexpr, FMAX: tl.constexpr,
                           MIN_SCALE: tl.constexpr, GROUP: tl.constexpr, FNUZ: tl.constexpr,
                           BLOCK: tl.constexpr):
        """Per-group quant of the columns [OFF, OFF + BLOCK) (OFF a multiple of GROUP)."""
        NG: tl.constexpr = BLOCK // GROUP
        xg = tl.reshape(xf, [NG, GROUP])
        amax = tl.max(tl.abs(xg), axis=1)
        scale = tl.maximum(tl.math.div_rn(amax, FMAX), MIN_SCALE)
        inv = tl.math.div_rn(tl.full([NG], 1.0, tl.float32), scale)
        v = tl.minimum(tl.maximum(xg * inv[:, None], -FMAX), FMAX)
        gi = tl.arange(0, NG)
        cols = OFF + gi[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        tl.store(q_ptr + row * K + cols, _fp8_encode(v, FNUZ), mask=cols < K)
        n_groups = K // GROUP
        g = OFF // GROUP + gi
        tl.store(s_ptr + row * n_groups + g, scale, mask=g < n_groups)

    @triton.jit
    def _quant_row(xa, xb, row, q_ptr, s_ptr, K, FMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                   GROUP: tl.constexpr, FNUZ: tl.constexpr, BLOCK_A: tl.constexpr,
                   BLOCK_B: tl.constexpr):
        """Dynamic fp8 quant of a row held as two parts (fp32 holding activation-dtype
        values, zero past K): columns [0, BLOCK_A) and [BLOCK_A, BLOCK_A + BLOCK_B)."""
        if GROUP == 0:
            amax = tl.max(tl.abs(xa), axis=0)
            if BLOCK_B > 0:
                amax = tl.maximum(amax, tl.max(tl.abs(xb), axis=0))
            scale, inv = _token_scale(amax, FMAX, MIN_SCALE)
            _encode_store(xa, inv, row, q_ptr, K, 0, FMAX, FNUZ, BLOCK_A)
            if BLOCK_B > 0:
                _encode_store(xb, inv, row, q_ptr, K, BLOCK_A, FMAX, FNUZ, BLOCK_B)
            tl.store(s_ptr + row, scale)
        else:
            _group_quant_store(xa, row, q_ptr, s_ptr, K, 0, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK_A)
            if BLOCK_B > 0:
                _group_quant_store(xb, row, q_ptr, s_ptr, K, BLOCK_A, FMAX, MIN_SCALE, GROUP,
                                   FNUZ, BLOCK_B)

    @triton.jit
    def _add_part(y_ptr, r_ptr, ro_ptr, row, K, OFF: tl.constexpr, BLOCK: tl.constexpr):
        """s = y + r over [OFF, OFF + BLOCK) in fp32; stores the rounded new residual."""
        cols = OFF + tl.arange(0, BLOCK)
        mask = cols < K
        y = tl.load(y_ptr + row * K + cols, mask=mask, other=0.0)
        r = tl.load(r_ptr + row * K + cols, mask=mask, other=0.0)
        s = y.to(tl.float32) + r.to(tl.float32)
        tl.store(ro_ptr + row * K + cols, _round_to(s, ro_ptr.dtype.element_ty), mask=mask)
        return s

    @triton.jit
    def _norm_part(s, rstd, w_ptr, K, OFF: tl.constexpr, BLOCK: tl.constexpr, act: tl.constexpr):
        cols = OFF + tl.arange(0, BLOCK)
        w = tl.load(w_ptr + cols, mask=cols < K, other=0.0)
        return _round_to((s * rstd) * (w.to(tl.float32) + 1.0), act).to(tl.float32)

    @triton.jit
    def _norm_quant_row(sa, sb, row, w_ptr, q_ptr, s_ptr, K, eps, FMAX: tl.constexpr,
                        MIN_SCALE: tl.constexpr, GROUP: tl.constexpr, FNUZ: tl.constexpr,
                        BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, LOG2: tl.constexpr,
                        act: tl.constexpr):
        """RMSNorm + fp8 quant of one row held as two parts (sa, then sb when BLOCK_B > 0), in
        fp32; shared by this kernel and the fused two-rank all-reduce epilogue."""
        sqa = sa * sa
        mx = tl.max(sqa, axis=0)
        sqb = sqa  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            sqb = sb * sb
            mx = tl.maximum(mx, tl.max(sqb, axis=0))
        f = _sumsq_scale(mx, LOG2)
        total = _fixed(sqa, f)
        if BLOCK_B > 0:
            total += _fixed(sqb, f)
        sumsq = total.to(tl.float32) * _pow2(-f)
        var = tl.math.div_rn(sumsq, tl.cast(K, tl.float32))
        rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(var + eps))
        xa = _norm_part(sa, rstd, w_ptr, K, 0, BLOCK_A, act)
        xb = xa  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            xb = _norm_part(sb, rstd, w_ptr, K, BLOCK_A, BLOCK_B, act)
        _quant_row(xa, xb, row, q_ptr, s_ptr, K, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK_A, BLOCK_B)

    @triton.jit
    def _add_rms_quant_kernel(y_ptr, r_ptr, w_ptr, q_ptr, s_ptr, ro_ptr, K, eps,
                              FMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                              GROUP: tl.constexpr, FNUZ: tl.constexpr,
                              BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, LOG2: tl.constexpr):
        # The row is split into two power-of-two parts (5120 = 4096 + 1024) instead of one
        # padded block (8192): masked lanes cost the same instructions as live ones.
        row = tl.program_id(0).to(tl.int64)
        act: tl.constexpr = y_ptr.dtype.element_ty
        sa = _add_part(y_ptr, r_ptr, ro_ptr, row, K, 0, BLOCK_A)
        sb = sa  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            sb = _add_part(y_ptr, r_ptr, ro_ptr, row, K, BLOCK_A, BLOCK_B)
        _norm_quant_row(sa, sb, row, w_ptr, q_ptr, s_ptr, K, eps, FMAX, MIN_SCALE, GROUP, FNUZ,
                        BLOCK_A, BLOCK_B, LOG2, act)


def split_row(k: int) -> tuple[int, int]:
    """(BLOCK_A, BLOCK_B): the largest power of two <= k (at least 128), then the rest padded
    to a power of two (0 if none), e.g. 5120 -> (4096, 1024), 2048 -> (2048, 0)."""
    a = max(128, 1 << (max(k, 1).bit_length() - 1))
    rest = k - a
    return a, (triton_next_pow2(rest) if rest > 0 else 0)


def launch_params(k: int) -> tuple[int, int, int, int]:
    """(BLOCK_A, BLOCK_B, LOG2, num_warps) for a row of k elements held in registers."""
    a, b = split_row(k)
    lanes = a + b
    num_warps = 4 if lanes <= 2048 else 8 if lanes <= 8192 else 16
    return a, b, sum_log2(k), num_warps


def quant_constexprs(group_size: int, fp8_dtype: torch.dtype) -> dict:
    return {"FMAX": FP8_MAX[fp8_dtype], "MIN_SCALE": min_scale(fp8_dtype), "GROUP": group_size,
            "FNUZ": fp8_dtype == torch.float8_e4m3fnuz}


def _alloc(y: torch.Tensor, group_size: int, fp8_dtype: torch.dtype):
    m, k = y.shape
    q = torch.empty((m, k), dtype=fp8_dtype, device=y.device)
    scale = torch.empty(scale_shape(m, k, group_size), dtype=torch.float32, device=y.device)
    new_residual = torch.empty((m, k), dtype=y.dtype, device=y.device)
    return q, scale, new_residual


def add_rms_quant_triton(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         eps: float, group_size: int = 0, fp8_dtype: torch.dtype | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fp8_dtype = resolve_fp8_dtype(fp8_dtype, y.device)
    m, k = y.shape
    check_group(group_size, k)
    y = y.contiguous()
    residual = residual.contiguous()
    weight = weight.contiguous()
    q, scale, new_residual = _alloc(y, group_size, fp8_dtype)
    if m == 0:
        return q, scale, new_residual
    block_a, block_b, log2, num_warps = launch_params(k)
    _add_rms_quant_kernel[(m,)](
        y, residual, weight, q.view(torch.uint8), scale, new_residual, k, float(eps),
        BLOCK_A=block_a, BLOCK_B=block_b, LOG2=log2, num_warps=num_warps, enable_fp_fusion=False,
        **quant_constexprs(group_size, fp8_dtype))
    return q, scale, new_residual


# ---------------------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------------------

@torch.library.custom_op("radiance::add_rms_quant", mutates_args=())
def _add_rms_quant_op(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      group_size: int, fp8_dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if use_triton(y, residual, weight):
        return add_rms_quant_triton(y, residual, weight, eps, group_size, fp8_dtype)
    return add_rms_quant_reference(y, residual, weight, eps, group_size, fp8_dtype)


@_add_rms_quant_op.register_fake
def _(y, residual, weight, eps, group_size, fp8_dtype):
    check_group(group_size, y.shape[1])
    m, k = y.shape
    return (y.new_empty((m, k), dtype=fp8_dtype),
            y.new_empty(scale_shape(m, k, group_size), dtype=torch.float32),
            y.new_empty((m, k)))


def add_rms_quant(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  group_size: int = 0, fp8_dtype: torch.dtype | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [M, K] fp8, scale [M, 1] or [M, K/128] fp32, new_residual [M, K] y.dtype)."""
    return torch.ops.radiance.add_rms_quant(
        y, residual, weight, float(eps), int(group_size), resolve_fp8_dtype(fp8_dtype, y.device))


# ---------------------------------------------------------------------------------------
# AOT specialisations: the shipping dtypes (bf16 activations and weight), both fp8 formats,
# per token and per group, the hidden sizes of the Qwen3-Next family and the tiny test model.
# ---------------------------------------------------------------------------------------

AOT_HIDDEN = (2048, 5120)


def aot_options() -> dict:
    """The kernels run with fp fusion off; AotSpec carries compile options once it has the
    field (requested from the lead), so the AOT binary is the one launched at run time."""
    if "options" in getattr(aot.AotSpec, "__dataclass_fields__", {}):
        return {"options": {"enable_fp_fusion": False}}
    return {}


def _register_aot() -> None:
    if triton is None:
        return
    sig = {"y_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*fp32",
           "ro_ptr": "*bf16", "K": "i32", "eps": "fp32"}
    for k in AOT_HIDDEN:
        block_a, block_b, log2, num_warps = launch_params(k)
        for fp8_dtype in FP8_DTYPES:
            for group in SUPPORTED_GROUPS:
                consts = {**quant_constexprs(group, fp8_dtype), "BLOCK_A": block_a,
                          "BLOCK_B": block_b, "LOG2": log2}
                fmt = "fnuz" if fp8_dtype == torch.float8_e4m3fnuz else "fn"
                aot.register(aot.AotSpec(
                    name=f"add_rms_quant[bf16,K{k},{fmt},g{group}]", feature="fp8_stream",
                    kernel=_add_rms_quant_kernel,
                    signature={**sig, **{c: "constexpr" for c in consts}}, constexprs=consts,
                    num_warps=num_warps, **aot_options()))


_register_aot()
