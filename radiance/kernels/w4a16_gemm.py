"""W4A16 GEMM: ``out[M, N] = x[M, K] @ W[N, K]^T`` with W in the packed 4-bit layout of
``radiance.kernels.w4_layout`` (symmetric codes, one scale per output row and group of G along K).

bf16/fp16 activations, fp32 accumulation, output in the activation dtype.

Paths (``torch.ops.radiance.w4a16_gemm`` picks one):

* GPU, ``M <= LARGE_M``: the Triton kernel ``_w4a16_gemm_kernel``. It is written "swap-AB":
  the weight tile is the left operand (``[BLOCK_N, 16]`` per slab, rows of W on the tensor
  core's M side) and the activations the right one (``[16, BLOCK_M]``), so a decode batch of
  8 rows wastes no MMA rows, and the dequantised weights never leave registers: Triton's
  pipeliner stages the packed words through shared memory (a quarter of the bf16 bytes) and
  they are unpacked in the tensor-core operand layout (on Hopper: wgmma with A in
  registers). Each 128-wide K block makes 8 slabs, one per nibble (see the layout
  docstring); the slab products of one group are summed in fp32 and multiplied by that
  group's scale in fp32, so codes are multiplied exactly. On CUDA the unpack is inline PTX
  (``prmt`` + ``lop3`` + one packed ``fma`` per two codes, the "magic number" trick: about
  one integer instruction per code); elsewhere the same trick in portable Triton. Above 64
  rows the kernel tiles M in 64-row tiles, each re-streaming the weight.
  Split-K: when ``N / BLOCK_N`` tiles cannot fill the GPU, ``SPLIT_K`` programs share one
  output tile; each writes its fp32 partial to a workspace and the last one to arrive (an
  atomic ticket per tile) sums the partials in split order and writes the output: one
  launch, deterministic, and the ticket is reset to 0 by that last program, so the counters
  stay valid across launches and CUDA-graph replays.
  Tuned per shape (``Config``): the tile, the split and the pipeline depth. Variants that won
  nowhere on the H200 (two K blocks per loop step, the code bias folded into fp32 per group,
  a register cap) left the tree; docs/benchmarks.md keeps what they measured.
* GPU, ``M > LARGE_M`` (1024, prefill): **dequantise**, not chunk. Streaming the weight once
  per 64 rows would read it ``M / 64`` times, so instead the weight is dequantised to the
  activation dtype in row chunks (bounded transient) and multiplied with ``torch.matmul``.
  Between 64 and ``LARGE_M`` rows the kernel's M tiling is cheaper (measured crossover).
  The dequantised weight is rounded to bf16/fp16 there (relative 2^-9 for bf16), ~50x below
  the 4-bit error; the small-M path does not round it.
* CPU and anything the kernel does not take (fp32 activations): the reference
  ``w4a16_gemm_reference`` -- dequantise to fp32 (exact) and matmul in fp32.

Per-shape launch configs are data: ``radiance/configs/w4a16_gemm/<device>.json``, written by
``benchmarks/bench_w4a16_gemm.py --tune``. A shape that is not in the file runs with
``default_config`` (correct, just not tuned).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from radiance.kernels import aot, shipped
from radiance.kernels.dispatch import (DeviceInfo, describe, device_key, eager_gpu_call,  # noqa: F401
                                       register_library_op, use_triton)
from radiance.kernels import w4_layout as layout
from radiance.kernels.w4_common import dummy_workspace, split_k_counters

logger = logging.getLogger("radiance")

try:  # Triton is optional: the reference path serves CPU-only installs
    import triton
    import triton.language as tl

    from radiance.kernels.w4_common import store_tile, unpack_asm, unpack_one

    HAS_TRITON = True
except Exception:  # pragma: no cover - exercised only where triton is absent
    triton = tl = None
    HAS_TRITON = False

MAX_KERNEL_M = 64        # rows per kernel tile at most; the tuned band
# Above this, dequantise + matmul. Measured on the H200 (docs/benchmarks.md): the kernel costs
# about ceil(M / 64) x its M=64 time (gate_up 55 us per 64 rows, qkv 16 us), the torch-level
# dequantise about 0.3 ms (qkv) .. 1.7 ms (gate_up) before its matmul, so tiling wins to ~1k rows.
LARGE_M = 1024
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "w4a16_gemm"
TUNED_M = (1, 8, 16, 32, 64)


# --------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit(do_not_specialize=["M", "num_kblocks"])
    def _w4a16_gemm_kernel(
        x_ptr, qw_ptr, s_ptr, out_ptr, ws_ptr, cnt_ptr,
        M, N, K, stride_xm, stride_om, stride_qt, num_kblocks,
        GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
        SPLIT_K: tl.constexpr, FP16: tl.constexpr, USE_ASM: tl.constexpr, INTERPRET: tl.constexpr,
        EVEN_K: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_j = tl.arange(0, 16)
        n_in = offs_n < N
        m_in = offs_m < M

        # each split takes the same number of K blocks; only the last one can be short
        per_split = tl.cdiv(num_kblocks, SPLIT_K)
        kb_lo = pid_k * per_split
        kb_hi = tl.minimum(kb_lo + per_split, num_kblocks)

        # row n lives in 16-row tile n // 16 (stride_qt words per tile), 16 words per K block
        w_ptrs = qw_ptr + (offs_n // 16)[:, None] * stride_qt + ((offs_n % 16) * 16)[:, None] + offs_j[None, :]
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_j[None, :]
        SUBS: tl.constexpr = GROUP // 16 if GROUP < 128 else 8
        GPB: tl.constexpr = 128 // GROUP if GROUP < 128 else 1

        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for kb in range(kb_lo, kb_hi):
            w = tl.load(w_ptrs + kb * 256, mask=n_in[:, None], other=0)
            if USE_ASM:
                qs = unpack_asm(w, FP16)
            part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for i in tl.static_range(8):
                if USE_ASM:
                    q = qs[i]
                else:
                    q = unpack_one(w, i, FP16, INTERPRET)
                k0 = kb * 128 + 16 * i
                if EVEN_K:
                    xs = tl.load(x_ptrs + k0, mask=m_in[:, None], other=0.0)
                else:
                    xs = tl.load(x_ptrs + k0, mask=m_in[:, None] & (k0 + offs_j[None, :] < K), other=0.0)
                if INTERPRET:
                    part = tl.dot(q, tl.trans(xs).to(tl.float32), part, input_precision="ieee")
                else:
                    part = tl.dot(q, tl.trans(xs), part)
                if (i + 1) % SUBS == 0:
                    if GROUP < 128:
                        g = kb * GPB + i // SUBS
                    else:
                        g = (kb * 128) // GROUP
                    s = tl.load(s_ptr + g * N + offs_n, mask=n_in, other=0.0).to(tl.float32)
                    acc += part * s[:, None]
                    part = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)

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
    num_stages: int = 4

    def as_dict(self) -> dict:
        return asdict(self)


def block_m_for(m: int) -> int:
    return 16 if m <= 16 else (32 if m <= 32 else 64)


def m_bucket(m: int) -> int:
    """The tuned M a batch of ``m`` rows (<= MAX_KERNEL_M) uses: the smallest tuned M >= m."""
    for t in TUNED_M:
        if m <= t:
            return t
    return TUNED_M[-1]


def default_config(m: int, n: int, k: int, num_sms: int = 132) -> Config:
    """An untuned config that fills the GPU: 64-row weight tiles, split K until there are
    at least as many programs as SMs, keeping >= 4 K blocks per split."""
    bm = block_m_for(min(m, MAX_KERNEL_M))
    bn = 128 if n >= 128 * num_sms else 64
    tiles = -(-n // bn) * -(-min(m, LARGE_M) // bm)
    kblocks = layout.padded_k(k) // layout.KBLOCK
    split = 1
    while tiles * split < num_sms and split < 8 and kblocks // (split * 2) >= 4:
        split *= 2
    return Config(block_n=bn, block_m=bm, split_k=split, num_warps=4, num_stages=4)


def config_path(key: str) -> Path:
    return CONFIG_DIR / f"{key}.json"


@functools.cache
def load_table(key: str) -> dict[tuple[int, int, int], dict[int, Config]]:
    """{(N, K, G): {tuned M: Config}} from the device's JSON; {} if there is none."""
    path = config_path(key)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        table: dict[tuple[int, int, int], dict[int, Config]] = {}
        for entry in data["configs"]:
            key3 = (int(entry["n"]), int(entry["k"]), int(entry["group_size"]))
            table.setdefault(key3, {})[int(entry["m"])] = Config(**entry["config"])
        return table
    except Exception as exc:  # a broken table must not take the op down: defaults are correct
        logger.warning("radiance: ignoring unreadable w4a16 config table %s: %s", path, exc)
        return {}


def lookup_config(m: int, n: int, k: int, group_size: int, device: torch.device) -> Config:
    """The tuned config for this shape and batch on ``device``, else ``default_config``."""
    return config_for(m, n, k, group_size, describe(device))


def config_for(m: int, n: int, k: int, group_size: int, dev: DeviceInfo) -> Config:
    """The tuned config for this shape and batch on a device described by ``dev``, else
    ``default_config``. Cached: this sits on the launch path of every call."""
    mkey = m_bucket(m) if m <= MAX_KERNEL_M else -(-m // MAX_KERNEL_M) * MAX_KERNEL_M
    return _lookup(mkey, n, k, group_size, dev)


@functools.lru_cache(maxsize=4096)
def _lookup(mkey: int, n: int, k: int, group_size: int, dev: DeviceInfo) -> Config:
    by_m = load_table(dev.table_key).get((n, k, group_size))
    if by_m:
        cfg = by_m.get(m_bucket(min(mkey, MAX_KERNEL_M)))
        if cfg is not None:
            return dataclasses.replace(cfg, block_m=MAX_KERNEL_M) if mkey > MAX_KERNEL_M else cfg
    # no SM count (the interpreter on CPU): plan as for an H200-sized GPU
    return default_config(mkey, n, k, dev.num_sms or 132)


def clear_caches() -> None:
    """Forget loaded tables and looked-up configs (after ``--tune`` rewrote a table)."""
    load_table.cache_clear()
    _lookup.cache_clear()


# --------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------
def launch_plan(m: int, n: int, k: int, group_size: int, fp16: bool, dev: DeviceInfo,
                config: Config | None = None) -> tuple[Config, tuple[int, int, int], dict]:
    """(config, grid, keyword arguments) of the kernel launch for ``x [m, k] @ W[n, k]^T`` on a
    device described by ``dev``: everything the launch specialises on but the tensors and ints."""
    cfg = config or config_for(m, n, k, group_size, dev)
    kblocks = layout.padded_k(k) // layout.KBLOCK
    split = max(1, min(cfg.split_k, kblocks))
    grid = (-(-n // cfg.block_n), split, -(-m // cfg.block_m))
    kwargs = dict(
        GROUP=group_size, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, SPLIT_K=split,
        FP16=fp16, USE_ASM=dev.backend == "cuda" and not dev.interpret, INTERPRET=dev.interpret,
        EVEN_K=k % layout.KBLOCK == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return cfg, grid, kwargs


def w4a16_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
                      config: Config | None = None) -> torch.Tensor:
    """The Triton kernel for ``M <= LARGE_M`` (larger M is tiled too, but see the op)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable")
    m, k = x.shape
    n = scales.shape[1]
    kp = qweight.shape[1] * layout.KBLOCK
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"activations must be bf16 or fp16, got {x.dtype}")
    if layout.padded_k(k) != kp or not qweight.is_contiguous():
        raise ValueError(f"x has K={k}, packed weight holds Kp={kp} (contiguous: {qweight.is_contiguous()})")
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    _, grid, kwargs = launch_plan(m, n, k, group_size, x.dtype == torch.float16, describe(x.device), config)
    split = grid[1]
    kblocks = kp // layout.KBLOCK
    if split > 1:
        ws = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        cnt = split_k_counters(x.device, grid[0] * grid[2])
    else:
        # unused, but typed as in the split-K launch: one compiled signature for both
        ws, cnt = dummy_workspace(x.device), split_k_counters(x.device, 1)
    _w4a16_gemm_kernel[grid](
        x, qweight, scales, out, ws, cnt,
        m, n, k, x.stride(0), out.stride(0), qweight.stride(0), kblocks, **kwargs)
    return out


def _dequant_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    m, k = x.shape
    n = scales.shape[1]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rows = max(256, (1 << 24) // k) // layout.ROW_TILE * layout.ROW_TILE  # <= 64 MiB fp32 per chunk
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        w = layout.dequantize(qweight[r0 // layout.ROW_TILE: layout.row_tiles(r1)], scales[:, r0:r1], k,
                              group_size, dtype=x.dtype, rows=rows)
        out[:, r0:r1] = torch.matmul(x, w.t())
        del w
    return out


def w4a16_gemm_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dequantise (exactly, fp32) and matmul in fp32; output in x's dtype. Row-chunked."""
    m, k = x.shape
    n = scales.shape[1]
    x32 = x.float()
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rows = max(256, (1 << 24) // max(k, 1)) // layout.ROW_TILE * layout.ROW_TILE
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        w = layout.dequantize(qweight[r0 // layout.ROW_TILE: layout.row_tiles(r1)], scales[:, r0:r1], k,
                              group_size, dtype=torch.float32, rows=rows)
        out[:, r0:r1] = (x32 @ w.t()).to(x.dtype)
    return out


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got {tuple(x.shape)}")
    if qweight.dtype != torch.int32 or qweight.dim() != 4 or scales.dim() != 2:
        raise ValueError(f"qweight must be int32 [Np/16, Kp/128, 16, 16] and scales [Kp/G, N], got "
                         f"{qweight.dtype} {tuple(qweight.shape)}, {tuple(scales.shape)}")
    layout.check_group_size(x.shape[1], group_size)
    want_q, want_s = layout.packed_shapes(scales.shape[1], x.shape[1], group_size)
    if tuple(qweight.shape) != want_q or tuple(scales.shape) != want_s:
        raise ValueError(f"packed shapes {tuple(qweight.shape)}, {tuple(scales.shape)} do not match "
                         f"K={x.shape[1]}, G={group_size} (want {want_q}, {want_s})")


def _gpu_path(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The kernel up to LARGE_M rows, dequantise + matmul above (checked inputs)."""
    if x.shape[0] > LARGE_M:
        return _dequant_matmul(x, qweight, scales, group_size)
    return w4a16_gemm_triton(x, qweight, scales, group_size)


def _w4a16_gemm_gpu(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    _check(x, qweight, scales, group_size)
    if use_triton(x, qweight, scales) and x.dtype in (torch.bfloat16, torch.float16):
        return _gpu_path(x, qweight, scales, group_size)
    return w4a16_gemm_reference(x, qweight, scales, group_size)


def _w4a16_gemm_cpu(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    _check(x, qweight, scales, group_size)
    return w4a16_gemm_reference(x, qweight, scales, group_size)


def _w4a16_gemm_fake(x, qweight, scales, group_size):
    return x.new_empty((x.shape[0], scales.shape[1]))


_OP = register_library_op("w4a16_gemm", _w4a16_gemm_cpu, _w4a16_gemm_gpu, _w4a16_gemm_fake)


def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """``x [M, K] @ W^T`` for a packed 4-bit W through ``torch.ops.radiance.w4a16_gemm``: Triton on GPU
    tensors, the reference elsewhere."""
    return _OP(x, qweight, scales, group_size)


def gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The op, entered the cheapest way: eager calls on plain GPU tensors go straight to the path the op
    would take (vLLM computes logits outside its compiled graph, so the lm_head's call per draft slot
    would otherwise pay the dispatcher each time); traced, fake and CPU calls go through
    ``torch.ops.radiance.w4a16_gemm``."""
    if eager_gpu_call(x, qweight, scales) and x.dtype in (torch.bfloat16, torch.float16):
        _check(x, qweight, scales, group_size)
        return _gpu_path(x, qweight, scales, group_size)
    return _OP(x, qweight, scales, group_size)


# --------------------------------------------------------------------------------------
# ahead-of-time launches: the shipped shapes, every M the kernel serves (radiance.kernels.aot)
# --------------------------------------------------------------------------------------
def _aot_launches(dev: DeviceInfo, arch: str):
    group = shipped.W4A16_GROUP
    for name, (n, k) in shipped.W4A16.items():
        first_m: dict[Config, int] = {}
        for m in range(1, LARGE_M + 1):  # above LARGE_M the op dequantises: no kernel
            first_m.setdefault(config_for(m, n, k, group, dev), m)
        qshape, sshape = layout.packed_shapes(n, k, group)
        qw = torch.empty(qshape, dtype=torch.int32)
        sc = torch.empty(sshape, dtype=torch.bfloat16)
        for m in first_m.values():
            yield f"{name} M={m}", functools.partial(_aot_call, m, k, qw, sc, group)


def _aot_call(m, k, qw, sc, group):
    w4a16_gemm_triton(torch.empty((m, k), dtype=torch.bfloat16), qw, sc, group)


if HAS_TRITON:
    aot.register("w4a16_gemm", "w4", _aot_launches)
