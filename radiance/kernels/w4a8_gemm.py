"""W4A8 GEMM: ``out[M, N] = (a_q * a_scale) @ W[N, K]^T`` with fp8 activations ``a_q`` (as an
fp8-stream epilogue hands them over in an ``Fp8Activation``) and W in the packed 4-bit layout of
``radiance.kernels.w4_layout`` (symmetric codes, one scale per output row and group of G along K).

Activation scales (fp32): ``[1]`` / ``[1, 1]`` per tensor, ``[M, 1]`` per token, ``[M, K/128]``
per group of 128. Weight groups: G a multiple of 128 (the kernel's K step is one packed block).

Arithmetic, the same in the kernel and the reference: a code ``q`` in -8..7 is exact in e4m3fn
and e4m3fnuz, so each product ``q * a_q`` is exact; the products of one weight group are summed
in fp32, that sum is multiplied by the group's scale (and, with per-group activation scales, by
the 128-block's activation scale), the groups are summed in fp32, and a per-token / per-tensor
activation scale is applied once at the end; one rounding to ``out_dtype``. The kernel and the
reference differ only in fp32 summation order (and, on Hopper's fp8 wgmma, in its reduced-
precision addition of products inside one MMA, as fp8_gemm notes), so they agree to a few fp32
ulps of the group sums, not bit for bit.

Paths (``torch.ops.radiance.w4a8_gemm`` picks one):

* GPU, ``M <= LARGE_M``: ``_w4a8_gemm_kernel``, the W4A16 kernel's structure (swap-AB: the
  weight tile is the MMA's left operand, ``[BLOCK_N, KD]``, the activations the right one, so a
  decode batch wastes no MMA rows; split-K with a per-tile ticket, one launch, deterministic)
  with an fp8 dot: the codes of ``SLABS`` nibble slabs of a packed block are unpacked into one
  ``[BLOCK_N, 16 * SLABS]`` fp8 operand (column ``SLABS * j + t`` is ``k = 16 (d SLABS + t) + j``,
  the order the packed words hold them in, so no shuffle), and the activations are loaded in
  that same column order. fp8 MMA where the arch has one (sm_89+, gfx94x fnuz, gfx12 WMMA);
  on older NVIDIA both operands are upcast to fp16 (exact). The variant ``mma16`` instead
  unpacks each 16-wide slab to bf16 as W4A16 does (inline PTX on CUDA) against the fp8
  activation upcast to bf16 (exact; once per call, before the launch), then a bf16 MMA: the same
  exact products and fp32 sums. At decode the kernel is bound by the unpack, not the MMA, and on the H200 the PTX unpack
  to bf16 is cheaper than building fp8 operands (measured: the fp8-operand variant ran 2-3x
  slower than W4A16 at every decode shape), so its tuned table picks ``mma16``; targets without
  a table (gfx1201, gfx942) run the fp8 MMA by default.
* GPU, ``M > LARGE_M`` (prefill): the weight is dequantised to bf16 in row chunks and the
  activation to ``out_dtype`` (``a_q * a_scale``, one rounding, relative 2^-9 in bf16, far below
  the 4-bit error), then ``torch.matmul``: streaming the weight once per 64 rows would read it
  ``M / 64`` times.
* CPU (and the interpreter's checks): ``w4a8_gemm_reference``, the arithmetic above in fp32.

Per-shape launch configs are data: ``radiance/configs/w4a8_gemm/<device>.json``, written by
``benchmarks/bench_w4a8_gemm.py --tune``; a shape not in it runs ``default_config``.
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import aot, shipped
from . import w4_layout as layout
from .dispatch import DeviceInfo, describe, eager_gpu_call, register_library_op, use_triton
from .w4_common import dummy_workspace, split_k_counters
from .w4a16_gemm import HAS_TRITON, LARGE_M, MAX_KERNEL_M, m_bucket
from .w4a16_gemm import default_config as _w4a16_default

logger = logging.getLogger("radiance")

if HAS_TRITON:
    import triton
    import triton.language as tl

    # the layout's code unpack (its magic-number trick; inline PTX on CUDA) for the 16-bit MMA variant
    from .w4_common import store_tile, unpack_asm, unpack_one

KBLOCK = layout.KBLOCK
A_GROUP = 128            # the epilogue's per-group activation scales
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "w4a8_gemm"
OUT_DTYPES = (torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------------------
# scale layouts and checks
# --------------------------------------------------------------------------------------
def a_layout(a_scale: torch.Tensor, m: int, k: int) -> str:
    """"tensor", "token" or "group" (128 along K) for an activation scale of ``[M, K]`` codes."""
    if a_scale.numel() == 1 and a_scale.dim() <= 2:  # M = 1 per token is per tensor too
        return "tensor"
    if a_scale.dim() == 2 and tuple(a_scale.shape) == (m, 1):
        return "token"
    if a_scale.dim() == 2 and k % A_GROUP == 0 and tuple(a_scale.shape) == (m, k // A_GROUP):
        return "group"
    raise ValueError(f"a_scale of shape {tuple(a_scale.shape)} fits no layout for A [{m}, {k}] "
                     f"(expected [1], [M, 1] or [M, K/{A_GROUP}])")


def _check(a_q: torch.Tensor, a_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
           group_size: int, out_dtype: torch.dtype) -> str:
    if a_q.dim() != 2 or a_q.dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"a_q must be fp8 e4m3 [M, K], got {a_q.dtype} {tuple(a_q.shape)}")
    if a_scale.dtype != torch.float32:
        raise ValueError(f"a_scale must be float32, got {a_scale.dtype}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    m, k = a_q.shape
    if group_size % KBLOCK:
        raise ValueError(f"group size {group_size}: the W4A8 GEMM takes multiples of {KBLOCK}")
    layout.check_group_size(k, group_size)
    if qweight.dtype != torch.int32 or qweight.dim() != 4 or scales.dim() != 2:
        raise ValueError(f"qweight must be int32 [Np/16, Kp/128, 16, 16] and scales [Kp/G, N], got "
                         f"{qweight.dtype} {tuple(qweight.shape)}, {tuple(scales.shape)}")
    want_q, want_s = layout.packed_shapes(scales.shape[1], k, group_size)
    if tuple(qweight.shape) != want_q or tuple(scales.shape) != want_s:
        raise ValueError(f"packed shapes {tuple(qweight.shape)}, {tuple(scales.shape)} do not match "
                         f"K={k}, G={group_size} (want {want_q}, {want_s})")
    return a_layout(a_scale, m, k)


# --------------------------------------------------------------------------------------
# reference
# --------------------------------------------------------------------------------------
def w4a8_gemm_reference(a_q: torch.Tensor, a_scale: torch.Tensor, qweight: torch.Tensor,
                        scales: torch.Tensor, group_size: int, out_dtype: torch.dtype = torch.bfloat16
                        ) -> torch.Tensor:
    """The module doc's arithmetic in fp32, output rows of W in chunks (bounded temporaries)."""
    a_l = _check(a_q, a_scale, qweight, scales, group_size, out_dtype)
    m, k = a_q.shape
    n = scales.shape[1]
    a = a_q.float()
    sa = a_scale.float()
    out = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    rows = max(layout.ROW_TILE, (1 << 22) // max(k, 1) // layout.ROW_TILE * layout.ROW_TILE)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        codes = layout.unpack_codes(qweight[r0 // layout.ROW_TILE: layout.row_tiles(r1)], k, r1 - r0).float()
        acc = torch.zeros((m, r1 - r0), dtype=torch.float32, device=a_q.device)
        for g in range(k // group_size):
            part = torch.zeros_like(acc)
            for b in range(g * group_size // KBLOCK, (g + 1) * group_size // KBLOCK):
                ks = slice(b * KBLOCK, (b + 1) * KBLOCK)
                prod = a[:, ks] @ codes[:, ks].t()
                part += prod * sa[:, b:b + 1] if a_l == "group" else prod
            acc += part * scales[g, r0:r1].float()[None, :]
        if a_l != "group":
            acc *= sa.reshape(-1, 1) if a_l == "token" else sa.reshape(())
        out[:, r0:r1] = acc.to(out_dtype)
    return out


def dequantize_activation(a_q: torch.Tensor, a_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a_q * a_scale`` in ``dtype`` (fp32 product, one rounding)."""
    m, k = a_q.shape
    a_l = a_layout(a_scale, m, k)
    a = a_q.float()
    if a_l == "group":
        a = (a.view(m, k // A_GROUP, A_GROUP) * a_scale.float().unsqueeze(-1)).view(m, k)
    else:
        a = a * (a_scale.float().reshape(-1, 1) if a_l == "token" else a_scale.float().reshape(()))
    return a.to(dtype)


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit(do_not_specialize=["M", "num_kblocks"])
    def _w4a8_gemm_kernel(
        a_ptr, sa_ptr, qw_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr,
        M, N, stride_am, stride_sam, stride_om, stride_qt, num_kblocks,
        GROUP_KB: tl.constexpr, A_GROUP: tl.constexpr, A_TENSOR: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT_K: tl.constexpr, SLABS: tl.constexpr,
        UPCAST: tl.constexpr, INTERPRET: tl.constexpr, MMA16: tl.constexpr, USE_ASM: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n_in = offs_n < N
        m_in = offs_m < M
        KD: tl.constexpr = 16 * SLABS
        # column c of a dot's operands is code k = 16 * (slab0 + c % SLABS) + c // SLABS of the block
        offs_c = tl.arange(0, KD)
        k_of_c = 16 * (offs_c % SLABS) + offs_c // SLABS
        shifts = 4 * tl.arange(0, SLABS)

        # splits cover whole weight groups (the group scale multiplies a finished group sum)
        groups = num_kblocks // GROUP_KB
        per_split = tl.cdiv(groups, SPLIT_K)
        g_lo = pid_k * per_split
        g_hi = tl.minimum(g_lo + per_split, groups)

        w_ptrs = qw_ptr + (offs_n // 16)[:, None] * stride_qt + ((offs_n % 16) * 16)[:, None] + tl.arange(0, 16)[None, :]
        a_rows = a_ptr + offs_m[:, None] * stride_am  # M <= LARGE_M rows: int32 offsets suffice
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for g in range(g_lo, g_hi):
            part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for kk in tl.static_range(GROUP_KB):
                kb = g * GROUP_KB + kk
                w = tl.load(w_ptrs + kb * 256, mask=n_in[:, None], other=0)
                blk = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                if MMA16:
                    # codes (exact in bf16) per 16-wide slab as W4A16 unpacks them, the fp8 activation
                    # upcast to bf16 (exact: e4m3 has 4 significant bits); same products, same fp32 sums
                    if USE_ASM:
                        qs = unpack_asm(w, False)
                    for i in tl.static_range(8):
                        if USE_ASM:
                            q16 = qs[i]
                        else:
                            q16 = unpack_one(w, i, False, INTERPRET)
                        xs = tl.load(a_rows + kb * 128 + 16 * i + tl.arange(0, 16)[None, :], mask=m_in[:, None],
                                     other=0.0)
                        if INTERPRET:
                            blk = tl.dot(q16, tl.trans(xs.to(tl.float32)), blk, input_precision="ieee")
                        else:  # the launcher upcast them already (a no-op then)
                            blk = tl.dot(q16, tl.trans(xs.to(tl.bfloat16)), blk)
                for d in tl.static_range(0 if MMA16 else 8 // SLABS):
                    u = (w[:, :, None] >> (shifts + 4 * d * SLABS)[None, None, :]) & 0xF
                    u = tl.reshape(u, [BLOCK_N, KD])
                    xk = kb * 128 + 16 * d * SLABS + k_of_c
                    x = tl.load(a_rows + xk[None, :], mask=m_in[:, None], other=0.0)
                    if INTERPRET:
                        blk = tl.dot((u - 8).to(tl.float32), tl.trans(x.to(tl.float32)), blk,
                                     input_precision="ieee")
                    elif UPCAST:
                        blk = tl.dot((u - 8).to(tl.float16), tl.trans(x.to(tl.float16)), blk)
                    else:
                        q = (u - 8).to(tl.float16).to(a_ptr.dtype.element_ty)
                        blk = tl.dot(q, tl.trans(x), blk)
                if A_GROUP:
                    sa = tl.load(sa_ptr + offs_m * stride_sam + kb, mask=m_in, other=0.0)
                    part += blk * sa[None, :]
                else:
                    part += blk
            s = tl.load(s_ptr + g * N + offs_n, mask=n_in, other=0.0).to(tl.float32)
            acc += part * s[:, None]

        if not A_GROUP:
            if A_TENSOR:
                acc = acc * tl.load(sa_ptr)
            else:
                sa = tl.load(sa_ptr + offs_m * stride_sam, mask=m_in, other=0.0)
                acc = acc * sa[None, :]
        store_tile(acc, out_ptr, ws_ptr, cnt_ptr, offs_m, offs_n, m_in, n_in, stride_om, M, N,
                    pid_n, pid_k, pid_m, BLOCK_N, BLOCK_M, SPLIT_K)


# --------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    block_n: int = 64
    block_m: int = 16
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    slabs: int = 2     # nibble slabs per fp8 dot: K = 32 (2) .. 128 (8, one dot per packed block)
    mma16: bool = False  # bf16 MMA per 16-wide slab (codes unpacked as W4A16 does, activations upcast)

    def as_dict(self) -> dict:
        return asdict(self)


def default_config(m: int, n: int, k: int, num_sms: int = 132, backend: str = "hip") -> Config:
    """The W4A16 kernel's untuned plan (tile sizes, split-K filling the GPU). On CUDA the 16-bit MMA
    (on the H200 it won at every tuned shape: the unpack, not the MMA, bounds the kernel at decode,
    and the PTX unpack to bf16 is the cheapest); elsewhere the fp8 MMA, two slabs per dot."""
    base = _w4a16_default(m, n, k, num_sms)
    return Config(block_n=base.block_n, block_m=base.block_m, split_k=base.split_k, mma16=backend == "cuda")


@functools.cache
def load_table(key: str) -> dict[tuple[int, int, int], dict[int, Config]]:
    """{(N, K, G): {tuned M: Config}} from the device's JSON; {} if there is none."""
    path = CONFIG_DIR / f"{key}.json"
    if not path.is_file():
        return {}
    try:
        table: dict[tuple[int, int, int], dict[int, Config]] = {}
        for e in json.loads(path.read_text())["configs"]:
            table.setdefault((int(e["n"]), int(e["k"]), int(e["group_size"])), {})[int(e["m"])] = Config(**e["config"])
        return table
    except Exception as exc:  # a broken table must not take the op down: defaults are correct
        logger.warning("radiance: ignoring unreadable w4a8 config table %s: %s", path, exc)
        return {}


@functools.lru_cache(maxsize=4096)
def config_for(m: int, n: int, k: int, group_size: int, dev: DeviceInfo) -> Config:
    """The tuned config of the batch's M bucket (``w4a16_gemm.m_bucket``) on ``dev``, else the
    default; above MAX_KERNEL_M rows the M=64 entry with 64-row tiles."""
    by_m = load_table(dev.table_key).get((n, k, group_size), {})
    if not by_m:
        return default_config(m, n, k, dev.num_sms or 132, dev.backend)
    # a bucket the table lacks takes the next tuned one up (its tiles cover the rows), else the largest
    want = m_bucket(min(m, MAX_KERNEL_M))
    cfg = by_m[min((t for t in by_m if t >= want), default=max(by_m))]
    if cfg.block_m < min(m, MAX_KERNEL_M) and m > max(by_m):
        cfg = Config(**{**cfg.as_dict(), "block_m": MAX_KERNEL_M})
    if m > MAX_KERNEL_M:
        return Config(**{**cfg.as_dict(), "block_m": MAX_KERNEL_M})
    return cfg


def clear_caches() -> None:
    load_table.cache_clear()
    config_for.cache_clear()


# --------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------
def _needs_upcast(dev: DeviceInfo) -> bool:
    """No fp8 MMA before sm_89; every ROCm target here has one (gfx94x fnuz, gfx12 WMMA)."""
    return dev.backend == "cuda" and dev.capability < (8, 9)


def launch_plan(m: int, n: int, k: int, group_size: int, a_l: str, dev: DeviceInfo,
                config: Config | None = None) -> tuple[Config, tuple[int, int, int], dict]:
    """(config, grid, constexprs and options) of the launch for ``[m, k] x W[n, k]^T`` on ``dev``."""
    cfg = config or config_for(m, n, k, group_size, dev)
    groups = layout.padded_k(k) // group_size
    split = max(1, min(cfg.split_k, groups))
    grid = (-(-n // cfg.block_n), split, -(-m // cfg.block_m))
    kwargs = dict(GROUP_KB=group_size // KBLOCK, A_GROUP=a_l == "group", A_TENSOR=a_l == "tensor",
                  BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, SPLIT_K=split, SLABS=cfg.slabs,
                  UPCAST=_needs_upcast(dev), INTERPRET=dev.interpret, MMA16=cfg.mma16,
                  USE_ASM=cfg.mma16 and dev.backend == "cuda" and not dev.interpret,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return cfg, grid, kwargs


def _mma16_operand(a_q: torch.Tensor) -> torch.Tensor:
    """The codes as the 16-bit MMA reads them (exact: every e4m3 value is a bf16 value)."""
    return a_q.to(torch.bfloat16)


def w4a8_gemm_triton(a_q: torch.Tensor, a_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     group_size: int, out_dtype: torch.dtype = torch.bfloat16,
                     config: Config | None = None) -> torch.Tensor:
    """The Triton kernel (any M; the op sends M > LARGE_M to the dequantising path)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable")
    a_l = _check(a_q, a_scale, qweight, scales, group_size, out_dtype)
    if not qweight.is_contiguous():
        raise ValueError("qweight must be contiguous")
    m, k = a_q.shape
    n = scales.shape[1]
    if a_q.stride(-1) != 1:
        a_q = a_q.contiguous()
    sa = a_scale.reshape(1, 1) if a_l == "tensor" else a_scale
    if sa.stride(-1) != 1:
        sa = sa.contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    if m == 0:
        return out
    dev = describe(a_q.device)
    cfg, grid, kwargs = launch_plan(m, n, k, group_size, a_l, dev, config)
    if grid[1] > 1:
        ws = torch.empty((grid[1], m, n), dtype=torch.float32, device=a_q.device)
        cnt = split_k_counters(a_q.device, grid[0] * grid[2])
    else:  # unused, typed as in the split-K launch
        ws, cnt = dummy_workspace(a_q.device), split_k_counters(a_q.device, 1)
    # The interpreter has no fp8 pointers: it reads the (exact) fp32 values of the codes. The 16-bit
    # MMA takes the codes upcast to bf16 (exact) once here: converting them in the kernel repeats the
    # conversion in every N tile, and at decode that ALU work is what bounds the kernel (H200: +50 %).
    a_arg = a_q.float() if dev.interpret else _mma16_operand(a_q) if cfg.mma16 else a_q
    _w4a8_gemm_kernel[grid](
        a_arg, sa, qweight, scales, out, ws, cnt,
        m, n, a_q.stride(0), 0 if a_l == "tensor" else sa.stride(0), out.stride(0), qweight.stride(0),
        layout.padded_k(k) // KBLOCK, **kwargs)
    return out


def _dequant_matmul(a_q, a_scale, qweight, scales, group_size, out_dtype):
    m, k = a_q.shape
    n = scales.shape[1]
    x = dequantize_activation(a_q, a_scale, out_dtype)
    out = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    rows = max(256, (1 << 24) // k) // layout.ROW_TILE * layout.ROW_TILE  # <= 64 MiB fp32 per chunk
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        w = layout.dequantize(qweight[r0 // layout.ROW_TILE: layout.row_tiles(r1)], scales[:, r0:r1], k,
                              group_size, dtype=out_dtype, rows=rows)
        out[:, r0:r1] = torch.matmul(x, w.t())
        del w
    return out


# --------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------
def _w4a8_cpu(a_q: torch.Tensor, a_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              group_size: int, out_dtype: torch.dtype) -> torch.Tensor:
    return w4a8_gemm_reference(a_q, a_scale, qweight, scales, group_size, out_dtype)


def _w4a8_gpu(a_q: torch.Tensor, a_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              group_size: int, out_dtype: torch.dtype) -> torch.Tensor:
    if not use_triton(a_q, qweight, scales):
        return w4a8_gemm_reference(a_q, a_scale, qweight, scales, group_size, out_dtype)
    if a_q.shape[0] > LARGE_M:
        _check(a_q, a_scale, qweight, scales, group_size, out_dtype)
        return _dequant_matmul(a_q, a_scale, qweight, scales, group_size, out_dtype)
    return w4a8_gemm_triton(a_q, a_scale, qweight, scales, group_size, out_dtype)


def _w4a8_fake(a_q, a_scale, qweight, scales, group_size, out_dtype):
    _check(a_q, a_scale, qweight, scales, group_size, out_dtype)
    return a_q.new_empty((a_q.shape[0], scales.shape[1]), dtype=out_dtype)


# Library-registered (docs/architecture.md): it runs for every consuming linear of every layer.
_OP = register_library_op("w4a8_gemm", _w4a8_cpu, _w4a8_gpu, _w4a8_fake)


def w4a8_gemm(a_q: torch.Tensor, a_scale: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
              group_size: int, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a_q * a_scale) @ W^T`` for a packed 4-bit W; see the module doc."""
    if eager_gpu_call(a_q, a_scale, qweight, scales):
        return _w4a8_gpu(a_q, a_scale, qweight, scales, int(group_size), out_dtype)
    return _OP(a_q, a_scale, qweight, scales, int(group_size), out_dtype)


# --------------------------------------------------------------------------------------
# ahead-of-time launches: the radiance_w4 profiles' target linears, per-token scales (what the
# epilogue and radiance_w4 hand over), every class of M the kernel serves (radiance.kernels.aot)
# --------------------------------------------------------------------------------------
def _aot_launches(dev: DeviceInfo, arch: str):
    if not dev.has_fp8:
        return
    group = shipped.W4A8_GROUP
    fp8 = dev.fp8_dtype
    for name, (n, k) in shipped.W4A8.items():
        first_m: dict[tuple, int] = {}
        for m in range(1, LARGE_M + 1):  # above LARGE_M the op dequantises: no kernel
            first_m.setdefault((config_for(m, n, k, group, dev), m == 1), m)
        qshape, sshape = layout.packed_shapes(n, k, group)
        qw = torch.empty(qshape, dtype=torch.int32)
        sc = torch.empty(sshape, dtype=torch.bfloat16)
        for m in first_m.values():
            yield f"{name} M={m}", functools.partial(_aot_call, m, k, qw, sc, group, fp8)


def _aot_call(m, k, qw, sc, group, fp8):
    w4a8_gemm_triton(torch.empty((m, k), dtype=fp8), torch.empty((m, 1), dtype=torch.float32), qw, sc, group)


if HAS_TRITON:
    aot.register("w4a8_gemm", "fp8_stream", _aot_launches)
