"""What every fp8 epilogue shares: the formats, vLLM's dynamic-scale arithmetic, the correctly rounded
helpers of the PyTorch references, and the Triton pieces that quantise a row and store its codes.

The kernels (add_rms_quant, the two-rank all-reduce epilogue, gdn_norm_quant, quant_fp8) import
from here; nothing here imports a kernel. The arithmetic and the rounding points are documented in
add_rms_quant.py, the first kernel written on them; the reproducible exp (``exp_reference`` and its
Triton twin ``exp_f32``) is gdn_norm_quant's silu gate.

Which fp8 format a device quantises to, and its bound, come from vLLM where vLLM runs (the plugin,
the engine): ``current_platform.fp8_dtype()`` and ``get_fp8_min_max()`` (``dispatch.vllm_fp8``),
so the patches and the stock layers beside them can never disagree. Kernels used without vLLM
(their tests, benchmarks, the AOT build) fall back to the same facts in plain torch (``FP8_MAX``,
``DeviceInfo.fp8_dtype``).
"""
from __future__ import annotations

import struct

import torch

from .device import DeviceInfo
from .dispatch import fp8_dtype_for_device, vllm_fp8

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
    """vLLM's bound (get_fp8_min_max) where vLLM runs and quantises to this format; the table else."""
    v = vllm_fp8()
    return v[1] if v is not None and v[0] == fp8_dtype else FP8_MAX[fp8_dtype]


def min_scale(fp8_dtype: torch.dtype) -> float:
    """vLLM's floor on a dynamic scale, so an all-zero row still gets a finite 1/scale."""
    return 1.0 / (fp8_max(fp8_dtype) * 512.0)


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


def _f32(x: float) -> float:
    """A Python float that is exactly an fp32 value: the same constant on both sides."""
    return struct.unpack("f", struct.pack("f", x))[0]


# exp(t) in plain IEEE fp32 adds and multiplies, so torch reproduces the kernel bit for bit (libm,
# Sleef and the GPU's ex2.approx all differ in the last bit): Cody-Waite range reduction
# t = n ln2 + r, a degree-7 Horner polynomial in r, and 2^n built from the exponent bits.
LOG2E = _f32(1.4426950408889634)
LN2_HI = _f32(0.693145751953125)      # 16 significant bits: n * LN2_HI is exact for |n| < 256
LN2_LO = _f32(1.4286068203094172e-06)
EXP_C = tuple(_f32(1.0 / f) for f in (5040.0, 720.0, 120.0, 24.0, 6.0, 2.0))  # r^7 .. r^2
# exp's argument range: above, 2^n overflows; below, p * 2^n would go subnormal (flushed on
# some GPUs). A silu of |t| past these is t (or ~0) to far below bf16 resolution.
EXP_LO, EXP_HI = -80.0, 88.0


def exp_reference(t: torch.Tensor) -> torch.Tensor:
    """exp of an fp32 tensor in exactly ``exp_f32``'s operations (t clamped to [-80, 88])."""
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


def quantize_reference(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """QuantFP8.forward_native's arithmetic on [M, K] -> (codes [M, K], scales [M, K//G or 1])."""
    m, k = x.shape
    fmax = fp8_max(fp8_dtype)
    xf = x.to(torch.float32)
    xg = xf.reshape(m, k // group_size, group_size) if group_size else xf.reshape(m, 1, k)
    amax = xg.abs().amax(dim=-1)
    scale = div_rn(amax, fmax).clamp(min=min_scale(fp8_dtype))
    inv = div_rn(torch.ones_like(scale), scale)
    q = (xg * inv.unsqueeze(-1)).clamp(-fmax, fmax).to(fp8_dtype)
    return q.view(m, k), scale



# ---------------------------------------------------------------------------------------
# Triton pieces
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
    def _fp8_store(ptrs, v, mask, FNUZ: tl.constexpr, HW_FP8: tl.constexpr = False):
        """Stores clamped fp32 ``v`` as e4m3 codes through a uint8 or fp8 pointer. HW_FP8 (only
        set for e4m3fn on sm_89+): the cvt.rn.satfinite instruction, two values per instruction,
        the same round-to-nearest-even as the integer encoder on the clamped range."""
        if HW_FP8:
            code = v.to(tl.float8e4nv)
        else:
            code = _fp8_encode(v, FNUZ)
        tl.store(ptrs, code.to(ptrs.dtype.element_ty, bitcast=True), mask=mask)

    @triton.jit
    def round_to(x, dtype: tl.constexpr, NATIVE: tl.constexpr = False):
        """fp32 -> ``dtype`` round to nearest even. NATIVE: the compiler's conversion (RTNE on
        every GPU backend); otherwise bf16 is rounded on the bits first, so the conversion is
        exact everywhere, the interpreter's (which truncates) included."""
        if not NATIVE and dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
        return x.to(dtype)

    @triton.jit
    def row_cols(OFF: tl.constexpr, BLOCK: tl.constexpr, TWO_D: tl.constexpr = True):
        """Column indices of a row part. This kernel holds a part as [BLOCK / 8, 8] (TWO_D):
        every load and store of the row then takes the same 8-per-thread layout (16-byte bf16
        accesses, 8-byte code stores). As a flat [BLOCK] the loads and the byte-wide code
        store pick 16 per thread and the bf16 residual store 8, and the mismatch costs a
        shared-memory round trip and a CTA barrier. Callers with flat rows (silu_mul_quant,
        the all-reduce epilogue) get flat indices."""
        if TWO_D:
            return OFF + tl.arange(0, BLOCK // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
        else:
            return OFF + tl.arange(0, BLOCK)

    @triton.jit
    def pow2(e):
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    # Triton kernels only read module globals that are constexpr.
    _LOG2E = tl.constexpr(LOG2E)
    _LN2_HI = tl.constexpr(LN2_HI)
    _LN2_LO = tl.constexpr(LN2_LO)
    _C7, _C6, _C5, _C4, _C3, _C2 = (tl.constexpr(c) for c in EXP_C)
    _EXP_LO = tl.constexpr(EXP_LO)
    _EXP_HI = tl.constexpr(EXP_HI)

    @triton.jit
    def exp_f32(t):
        """exp_reference's operations in fp32 (compile with fp fusion off)."""
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
    def sumsq_scale(mx, LOG2: tl.constexpr):
        """The power of two f of exact_sumsq(): the largest square scaled stays < 2^(63-LOG2)."""
        e = ((mx.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
        return tl.minimum(tl.maximum(62 - LOG2 - e, -126), 126)

    @triton.jit
    def _encode_store(xf, inv, row, q_ptr, K, OFF: tl.constexpr, FMAX: tl.constexpr,
                      FNUZ: tl.constexpr, BLOCK: tl.constexpr, HW_FP8: tl.constexpr = False):
        cols = row_cols(OFF, BLOCK, len(xf.shape) == 2)
        v = tl.minimum(tl.maximum(xf * inv, -FMAX), FMAX)
        _fp8_store(q_ptr + row * K + cols, v, cols < K, FNUZ, HW_FP8)

    @triton.jit
    def _token_scale(amax, FMAX: tl.constexpr, MIN_SCALE: tl.constexpr):
        scale = tl.maximum(tl.math.div_rn(amax, FMAX), MIN_SCALE)
        return scale, tl.math.div_rn(1.0, scale)

    @triton.jit
    def group_quant_store(xf, row, q_ptr, s_ptr, K, OFF, FMAX: tl.constexpr,
                           MIN_SCALE: tl.constexpr, GROUP: tl.constexpr, FNUZ: tl.constexpr,
                           BLOCK: tl.constexpr, HW_FP8: tl.constexpr = False):
        """Per-group quant of the columns [OFF, OFF + BLOCK) (OFF a multiple of GROUP). A row
        part held as [BLOCK / 8, 8] is viewed as [groups, GROUP / 8, 8], which keeps each
        thread's 8 columns in place (no layout conversion)."""
        NG: tl.constexpr = BLOCK // GROUP
        gi = tl.arange(0, NG)
        if len(xf.shape) == 2:
            xg = tl.reshape(xf, [NG, GROUP // 8, 8])
            amax = tl.max(tl.max(tl.abs(xg), axis=2), axis=1)
            scale = tl.maximum(tl.math.div_rn(amax, FMAX), MIN_SCALE)
            inv = tl.math.div_rn(tl.full([NG], 1.0, tl.float32), scale)
            v = tl.minimum(tl.maximum(xg * inv[:, None, None], -FMAX), FMAX)
            cols = (OFF + gi[:, None, None] * GROUP + tl.arange(0, GROUP // 8)[None, :, None] * 8
                    + tl.arange(0, 8)[None, None, :])
        else:
            xg = tl.reshape(xf, [NG, GROUP])
            amax = tl.max(tl.abs(xg), axis=1)
            scale = tl.maximum(tl.math.div_rn(amax, FMAX), MIN_SCALE)
            inv = tl.math.div_rn(tl.full([NG], 1.0, tl.float32), scale)
            v = tl.minimum(tl.maximum(xg * inv[:, None], -FMAX), FMAX)
            cols = OFF + gi[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
        _fp8_store(q_ptr + row * K + cols, v, cols < K, FNUZ, HW_FP8)
        n_groups = K // GROUP
        g = OFF // GROUP + gi
        tl.store(s_ptr + row * n_groups + g, scale, mask=g < n_groups)

    @triton.jit
    def quant_row(xa, xb, row, q_ptr, s_ptr, K, FMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                   GROUP: tl.constexpr, FNUZ: tl.constexpr, BLOCK_A: tl.constexpr,
                   BLOCK_B: tl.constexpr, HW_FP8: tl.constexpr = False):
        """Dynamic fp8 quant of a row held as two parts (fp32 holding activation-dtype
        values, zero past K): columns [0, BLOCK_A) and [BLOCK_A, BLOCK_A + BLOCK_B)."""
        if GROUP == 0:
            amax = tl.max(tl.abs(xa))
            if BLOCK_B > 0:
                amax = tl.maximum(amax, tl.max(tl.abs(xb)))
            token_quant_store(xa, xb, amax, row, q_ptr, s_ptr, K, FMAX, MIN_SCALE, FNUZ,
                               BLOCK_A, BLOCK_B, HW_FP8)
        else:
            group_quant_store(xa, row, q_ptr, s_ptr, K, 0, FMAX, MIN_SCALE, GROUP, FNUZ, BLOCK_A,
                               HW_FP8)
            if BLOCK_B > 0:
                group_quant_store(xb, row, q_ptr, s_ptr, K, BLOCK_A, FMAX, MIN_SCALE, GROUP,
                                   FNUZ, BLOCK_B, HW_FP8)

    @triton.jit
    def token_quant_store(xa, xb, amax, row, q_ptr, s_ptr, K, FMAX: tl.constexpr,
                           MIN_SCALE: tl.constexpr, FNUZ: tl.constexpr, BLOCK_A: tl.constexpr,
                           BLOCK_B: tl.constexpr, HW_FP8: tl.constexpr):
        scale, inv = _token_scale(amax, FMAX, MIN_SCALE)
        _encode_store(xa, inv, row, q_ptr, K, 0, FMAX, FNUZ, BLOCK_A, HW_FP8)
        if BLOCK_B > 0:
            _encode_store(xb, inv, row, q_ptr, K, BLOCK_A, FMAX, FNUZ, BLOCK_B, HW_FP8)
        tl.store(s_ptr + row, scale)


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
    return {"FMAX": fp8_max(fp8_dtype), "MIN_SCALE": min_scale(fp8_dtype), "GROUP": group_size,
            "FNUZ": fp8_dtype == torch.float8_e4m3fnuz}


def native_constexprs(dev: DeviceInfo, fp8_dtype: torch.dtype) -> dict:
    """NATIVE (the compiler's RTNE fp32 -> bf16) and HW_FP8 (cvt.rn.satfinite to e4m3fn) where
    they were checked bit for bit against the reference: NVIDIA GPUs (fp8 from sm_89). The
    interpreter truncates on conversion and ROCm has not been run, so both keep the integer
    paths there."""
    if dev.interpret or dev.backend != "cuda":
        return {"NATIVE": False, "HW_FP8": False}
    return {"NATIVE": True, "HW_FP8": fp8_dtype == torch.float8_e4m3fn and dev.capability >= (8, 9)}


def fp8_tag(fp8_dtype: torch.dtype) -> str:
    """The fp8 format's short name in benchmark and test ids: 'fn' (e4m3fn) or 'fnuz' (e4m3fnuz)."""
    return "fnuz" if fp8_dtype == torch.float8_e4m3fnuz else "fn"


def codes_as_bytes(fp8_dtype: torch.dtype, dev: DeviceInfo) -> bool:
    """Whether a kernel must be handed the fp8 codes as uint8: the interpreter has no fp8
    pointers, and Triton on NVIDIA none of the fnuz format."""
    return dev.interpret or (fp8_dtype == torch.float8_e4m3fnuz and dev.backend != "hip")
