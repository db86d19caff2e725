"""Per-row (max, sum-exp, argmax) of a [B, V_shard] logits block: the draft controller's capture.

The dynamic-draft controller needs two numbers per request per draft slot: the drafted token and
its top-1 softmax probability. Both follow from three per-row reductions over the vocabulary:

    max_j x_j,   sum_j exp(x_j - max),   argmax_j x_j      ->   token = argmax, conf = 1 / sum-exp

and the same three numbers computed on a vocabulary *shard* combine exactly across tensor-parallel
ranks (a cross-rank logsumexp, see ``radiance.draft.local_vocab``), which is why this op works on
a shard and takes ``n_valid``: columns at or past ``n_valid`` (the padding vLLM appends to the last
shard) are treated as -inf, so they can never be the argmax nor add to the sum.

The Triton kernel is a split reduction with the combine in the same launch: a row is cut into
column splits, one program per (row, split) reduces its split and writes a partial; the program
that finishes last for a row (a per-row arrival counter) combines the partials. One launch matters:
at B=8 the whole 248320-wide block is ~4 MB, under a microsecond of HBM time, so the launch count,
not bandwidth, sets the time. The counters reset themselves, so they are allocated once and the
launch can be captured in a CUDA graph.

Inside a split every lane of the tile keeps its own running (max, sum-exp relative to that max,
tile of its max) across the loop, with one exp per element and no cross-lane work until the end:
a cross-lane reduction per tile costs barriers that stall the loads behind it. The lanes are
reduced once, after the loop.

``draft_top1`` is the same launch for a whole vocabulary (TP=1): the combining program writes the
greedy token (int64, vLLM's next input) and the slot's row for the host, the token ids then the bits
of their probabilities (int32 [2B]), instead of max and sum. The draft slot then costs the host one
launch and one copy; casting, dividing and concatenating after the capture cost three launches,
which on a slow host were most of the per-slot host time (docs/benchmarks.md).

Ties resolve to the lowest column, like ``torch.argmax``; the sum's order differs from the
reference, so sum-exp agrees to fp32 rounding, max and argmax exactly.

Launch configs are data: ``radiance/configs/draft_confidence/<device>.json`` ((columns, rows) ->
block, unroll, warps, programs per SM, pipeline stages), written by
``benchmarks/bench_draft_confidence.py --tune``; without a table the module defaults below apply.
The public ``draft_confidence`` sends eager CUDA tensors straight to the launcher, past the
dispatcher: even ``torch.library.Library``'s dispatch costs microseconds a call (``custom_op``'s cost
~25 us on the H200 host, more than the kernel).
"""
from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import aot, shipped
from .dispatch import (  # noqa: F401  (device_key: the benchmarks name tables by it)
    DeviceInfo,
    describe,
    device_key,
    eager_gpu_call,
    plan_cache,
    register_library_op,
)

try:  # Triton is optional: a CPU-only install runs the reference
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

logger = logging.getLogger(__name__)

# Partials a row may be split into; the combine reads this many slots (masked), so it is a
# compile-time size and also the cap on the split count the launcher picks. 128 lets B=8 spread
# over every SM (8 rows x 128 splits = 1024 programs).
MAX_SPLITS = 128
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "draft_confidence"


@dataclass(frozen=True)
class Config:
    block: int = 1024          # lanes per tile (each lane keeps its own running max / sum / tile)
    unroll: int = 4            # tiles loaded before they are folded (1, 2, 4 or 8): bytes in flight
    num_warps: int = 4
    programs_per_sm: int = 8   # resident programs the split plan aims for, per SM
    stages: int = 1            # > 1: the chunk loop is software-pipelined this deep (cp.async)

    def as_dict(self) -> dict:
        return asdict(self)


# Used where no per-device table covers the batch. On the H200 it was within 2% of the tuned best
# at every batch size from 1 to 128 (docs/benchmarks.md, 2026-11-29).
DEFAULT_CONFIG = Config()


if triton is not None:

    @triton.jit
    def _fold(x, t, m_vec, s_vec, t_vec, GUARD_NEG_INF: tl.constexpr):
        """One tile into the per-lane accumulators: one exp per element, no cross-lane work.
        ``t_vec`` holds the first column of the tile each lane's max came from (a scalar per tile,
        so no per-element index arithmetic); the lane's column is ``t_vec + lane``."""
        gt = x > m_vec  # strictly: a lane keeps its earliest column on a tie
        # exp(-|x - m|) is the summand when x <= m and the rescale of the old sum when x > m.
        # (|d| times a negative constant folds into one multiply; -|d| * c costs an extra add)
        e = tl.exp2(tl.abs(x - m_vec) * -1.4426950408889634)
        if GUARD_NEG_INF:
            # -inf - -inf is NaN: a lane that has seen only -inf must add nothing for another
            # -inf. (Not needed when the lanes start at a finite floor below every input.)
            e = tl.where(x > float("-inf"), e, 0.0)
        s_vec = tl.where(gt, s_vec * e + 1.0, s_vec + e)
        t_vec = tl.where(gt, t, t_vec)
        m_vec = tl.maximum(m_vec, x)
        return m_vec, s_vec, t_vec

    @triton.jit
    def _load_chunk(p, mask, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        """UNROLL consecutive tiles at ``p`` (unused slots repeat the first: no extra loads)."""
        xa = tl.load(p, mask=mask)
        xb = xa
        xc = xa
        xd = xa
        if UNROLL >= 2:
            xb = tl.load(p + BLOCK, mask=mask)
        if UNROLL >= 4:
            xc = tl.load(p + 2 * BLOCK, mask=mask)
            xd = tl.load(p + 3 * BLOCK, mask=mask)
        return xa, xb, xc, xd

    @triton.jit
    def _fold_chunk(xa, xb, xc, xd, t, m_vec, s_vec, t_vec, BLOCK: tl.constexpr,
                    UNROLL: tl.constexpr, GUARD: tl.constexpr):
        m_vec, s_vec, t_vec = _fold(xa.to(tl.float32), t, m_vec, s_vec, t_vec, GUARD)
        if UNROLL >= 2:
            m_vec, s_vec, t_vec = _fold(xb.to(tl.float32), t + BLOCK, m_vec, s_vec, t_vec, GUARD)
        if UNROLL >= 4:
            m_vec, s_vec, t_vec = _fold(xc.to(tl.float32), t + 2 * BLOCK, m_vec, s_vec, t_vec,
                                        GUARD)
            m_vec, s_vec, t_vec = _fold(xd.to(tl.float32), t + 3 * BLOCK, m_vec, s_vec, t_vec,
                                        GUARD)
        return m_vec, s_vec, t_vec

    @triton.jit
    def _lanes_init(start, BLOCK: tl.constexpr, GUARD: tl.constexpr):
        """Empty per-lane accumulators for a split starting at column ``start``."""
        # bf16/fp16 inputs are all above -FLT_MAX, so lanes can start there instead of at -inf:
        # then no difference is ever -inf - -inf and the fold needs no NaN guard (an
        # instruction and a half per element). An fp32 input can equal -FLT_MAX: it keeps -inf.
        floor = float("-inf") if GUARD else -3.4028234663852886e38
        m_vec = tl.full((BLOCK,), floor, tl.float32)
        s_vec = tl.zeros((BLOCK,), tl.float32)
        # an all -inf split reports its first column, like torch.argmax would
        t_vec = tl.zeros((BLOCK,), tl.int32) + start
        return m_vec, s_vec, t_vec

    @triton.jit
    def _fold_ragged(row_ptr, first, stop, step, m_vec, s_vec, t_vec, BLOCK: tl.constexpr,
                     GUARD: tl.constexpr):
        """Masked tiles at ``first``, ``first + step``, ... below ``stop`` (the ragged end of the
        split that holds n_valid; padding reads as -inf), then the lanes' final state."""
        offs = tl.arange(0, BLOCK)
        for t in range(first, stop, step):
            x = tl.load(row_ptr + t + offs, mask=t + offs < stop, other=float("-inf"))
            m_vec, s_vec, t_vec = _fold(x.to(tl.float32), t, m_vec, s_vec, t_vec, GUARD)
        if not GUARD:
            # a lane still at the floor with nothing summed saw only -inf (every finite input
            # adds at least exp(0) = 1 when it becomes the max)
            m_vec = tl.where(s_vec == 0.0, float("-inf"), m_vec)
        return m_vec, s_vec, t_vec

    @triton.jit
    def _fold_split(row_ptr, start, stop, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                    STAGES: tl.constexpr, GUARD: tl.constexpr):
        """Columns [start, stop) of one row into per-lane (max, sum-exp, tile) accumulators.
        GUARD: the logits are fp32 (lanes start at -inf and the fold guards -inf - -inf)."""
        offs = tl.arange(0, BLOCK)
        CHUNK: tl.constexpr = BLOCK * UNROLL
        n_full = tl.maximum(stop - start, 0) // CHUNK
        m_vec, s_vec, t_vec = _lanes_init(start, BLOCK, GUARD)
        # Unmasked whole chunks: 16-byte loads whatever n_valid's alignment. STAGES > 1 lets
        # Triton pipeline the loop (asynchronous copies to shared memory, STAGES - 1 chunks
        # ahead), so a warp's memory wait overlaps its arithmetic: loads issued in registers
        # ahead of the fold get sunk by ptxas next to their use (seen in the SASS), and without
        # overlap the programs of an SM, started together, alternate between all waiting and
        # all computing while HBM idles.
        for c in tl.range(0, n_full, num_stages=STAGES):
            t = start + c * CHUNK
            if UNROLL == 8:  # two groups of four tiles, all eight loaded before the first fold
                xa, xb, xc, xd = _load_chunk(row_ptr + t + offs, None, BLOCK, 4)
                xe, xf, xg, xh = _load_chunk(row_ptr + t + 4 * BLOCK + offs, None, BLOCK, 4)
                m_vec, s_vec, t_vec = _fold_chunk(xa, xb, xc, xd, t, m_vec, s_vec, t_vec,
                                                  BLOCK, 4, GUARD)
                m_vec, s_vec, t_vec = _fold_chunk(xe, xf, xg, xh, t + 4 * BLOCK, m_vec, s_vec,
                                                  t_vec, BLOCK, 4, GUARD)
            else:
                xa, xb, xc, xd = _load_chunk(row_ptr + t + offs, None, BLOCK, UNROLL)
                m_vec, s_vec, t_vec = _fold_chunk(xa, xb, xc, xd, t, m_vec, s_vec, t_vec,
                                                  BLOCK, UNROLL, GUARD)
        return _fold_ragged(row_ptr, start + n_full * CHUNK, stop, BLOCK, m_vec, s_vec, t_vec,
                            BLOCK, GUARD)

    @triton.jit
    def _lanes_to_partial(m_vec, s_vec, t_vec, BLOCK: tl.constexpr):
        """The split's (max, sum-exp relative to it, first column of the max) from its lanes."""
        m = tl.max(m_vec, 0)
        base = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(s_vec * tl.exp(m_vec - base), 0)  # a lane at -inf has s = 0: adds 0
        idx = tl.min(tl.where(m_vec == m, t_vec + tl.arange(0, BLOCK), 2147483647), 0)
        return m, s, idx

    @triton.jit
    def _publish_partial(m, s, idx, row, split, nsplit, part_max_ptr, part_sum_ptr, part_idx_ptr,
                         count_ptr, NSPLIT_P2: tl.constexpr):
        """Stores the split's partial and arrives; true for the row's last program to arrive."""
        part = row * NSPLIT_P2 + split
        tl.store(part_max_ptr + part, m)
        tl.store(part_sum_ptr + part, s)
        tl.store(part_idx_ptr + part, idx)
        # Every thread's partial store must precede the arrival that publishes it.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
        return arrived == nsplit - 1

    @triton.jit
    def _load_partials(row, nsplit, part_max_ptr, part_sum_ptr, part_idx_ptr,
                       NSPLIT_P2: tl.constexpr):
        """The row's partials (max, sum, index, live mask); dead slots are neutral."""
        k = tl.arange(0, NSPLIT_P2)
        live = k < nsplit
        # volatile: the other programs' partials must come from L2, not a stale L1 line
        pm = tl.load(part_max_ptr + row * NSPLIT_P2 + k, mask=live, other=float("-inf"),
                     volatile=True)
        ps = tl.load(part_sum_ptr + row * NSPLIT_P2 + k, mask=live, other=0.0, volatile=True)
        pi = tl.load(part_idx_ptr + row * NSPLIT_P2 + k, mask=live, other=2147483647,
                     volatile=True)
        return pm, ps, pi, live

    @triton.jit
    def _store_row(big_m, total, best, row, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                   PACKED: tl.constexpr):
        if PACKED:
            # the host row of the draft slot, [token ids | confidence bits], int32: one copy to the
            # host and nothing else launched per slot (``draft_top1``); max and sum stay on chip
            rows = tl.num_programs(0)
            tl.store(out_max_ptr + row, best)
            tl.store(out_max_ptr + rows + row, tl.math.div_rn(1.0, total).to(tl.int32, bitcast=True))
        else:
            tl.store(out_max_ptr + row, big_m)
            tl.store(out_sum_ptr + row, total)
        tl.store(out_idx_ptr + row, best.to(tl.int64))
        tl.store(count_ptr + row, 0)  # ready for the next launch on this stream

    @triton.jit
    def _arrive_and_combine(m, s, idx, row, split, nsplit, part_max_ptr, part_sum_ptr,
                            part_idx_ptr, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                            NSPLIT_P2: tl.constexpr, PACKED: tl.constexpr):
        """Publishes the split's partial; the row's last program to arrive combines them all."""
        if _publish_partial(m, s, idx, row, split, nsplit, part_max_ptr, part_sum_ptr,
                            part_idx_ptr, count_ptr, NSPLIT_P2):
            pm, ps, pi, live = _load_partials(row, nsplit, part_max_ptr, part_sum_ptr,
                                              part_idx_ptr, NSPLIT_P2)
            big_m = tl.max(pm, 0)
            base = tl.where(big_m == float("-inf"), 0.0, big_m)
            total = tl.sum(ps * tl.exp(pm - base), 0)
            best = tl.min(tl.where(live & (pm == big_m), pi, 2147483647), 0)
            _store_row(big_m, total, best, row, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                       PACKED)

    @triton.jit
    def _draft_confidence_kernel(
        logits_ptr, stride_row, n_valid,
        part_max_ptr, part_sum_ptr, part_idx_ptr, count_ptr,
        out_max_ptr, out_sum_ptr, out_idx_ptr,
        split_cols,
        BLOCK: tl.constexpr,
        UNROLL: tl.constexpr,
        NSPLIT_P2: tl.constexpr,
        STAGES: tl.constexpr,
        PACKED: tl.constexpr,
    ):
        row = tl.program_id(0)
        split = tl.program_id(1)
        start = split * split_cols
        m_vec, s_vec, t_vec = _fold_split(
            logits_ptr + row.to(tl.int64) * stride_row, start,
            tl.minimum(start + split_cols, n_valid), BLOCK, UNROLL, STAGES,
            logits_ptr.dtype.element_ty == tl.float32)
        m, s, idx = _lanes_to_partial(m_vec, s_vec, t_vec, BLOCK)
        _arrive_and_combine(m, s, idx, row, split, tl.num_programs(1), part_max_ptr, part_sum_ptr,
                            part_idx_ptr, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                            NSPLIT_P2, PACKED)


# --- reference -----------------------------------------------------------------------------

def draft_confidence_reference(logits: torch.Tensor, n_valid: int = -1
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(max fp32 [B], sum-exp fp32 [B], argmax int64 [B]) over ``logits[:, :n_valid]``.

    ``n_valid < 0`` means every column. Columns past ``n_valid`` count as -inf.
    """
    x = logits.float()
    if 0 <= n_valid < x.shape[-1]:
        x = x.clone()
        x[:, n_valid:] = float("-inf")
    big_m = x.max(dim=-1).values
    base = torch.where(big_m == float("-inf"), torch.zeros_like(big_m), big_m)
    total = torch.exp(x - base[:, None]).sum(dim=-1)
    return big_m, total, x.argmax(dim=-1)


# --- launch configs ------------------------------------------------------------------------

# The columns the table's entries without a "cols" field were tuned at (the first table's V).
TABLE_COLS = 248320


@functools.cache
def load_table(key: str) -> dict[int, tuple[tuple[int, Config], ...]]:
    """{columns: ((rows, Config), ...) sorted by rows} from the device's JSON; {} if there is none."""
    path = CONFIG_DIR / f"{key}.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        table: dict[int, list] = {}
        for e in data["configs"]:
            table.setdefault(int(e.get("cols", TABLE_COLS)), []).append((int(e["rows"]), Config(**e["config"])))
        return {cols: tuple(sorted(entries)) for cols, entries in table.items()}
    except Exception as exc:  # a broken table must not take the op down: defaults are correct
        logger.warning("radiance: ignoring unreadable draft_confidence table %s: %s", path, exc)
        return {}


def config_for(rows: int, device: torch.device, cols: int = TABLE_COLS) -> Config:
    """The tuned config for a [rows, cols] block on ``device`` (see ``plan_config``)."""
    return plan_config(rows, cols, describe(device))


def plan_config(rows: int, cols: int, dev: DeviceInfo) -> Config:
    """From the table of the columns nearest ``cols`` (by ratio), the entry of the smallest tuned
    batch >= ``rows`` (the largest past the end); ``DEFAULT_CONFIG`` without a table."""
    table = load_table(dev.table_key) if dev.backend != "cpu" else {}
    if not table:
        return DEFAULT_CONFIG
    entries = table[min(table, key=lambda c: (abs(math.log(c / max(cols, 1))), c))]
    for tuned_rows, cfg in entries:
        if rows <= tuned_rows:
            return cfg
    return entries[-1][1]


def split_plan(rows: int, n_cols: int, sm_count: int, block: int = DEFAULT_CONFIG.block,
               programs_per_sm: int = DEFAULT_CONFIG.programs_per_sm,
               unroll: int = 1) -> tuple[int, int]:
    """(columns per split, number of splits): about ``programs_per_sm`` programs per SM in all,
    each split a whole number of ``block * unroll`` chunks, at most MAX_SPLITS splits."""
    chunk = block * unroll
    want = max(1, min(MAX_SPLITS, math.ceil(programs_per_sm * sm_count / max(rows, 1))))
    chunks = max(1, math.ceil(n_cols / chunk))
    per_split = max(1, math.ceil(chunks / want))
    nsplit = math.ceil(chunks / per_split)
    return per_split * chunk, nsplit


# --- Triton launcher -----------------------------------------------------------------------

# (device index, stream) -> (partial max, partial sum, partial idx, arrival counters). Per stream:
# two launches on one stream are ordered; on two streams they could interleave tickets.
_SCRATCH: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
# Per call signature: everything a repeat launch needs, so the hot path does no planning.
_LAUNCHES: dict[tuple, tuple] = plan_cache()


def _scratch(device: torch.device, stream: int, rows: int):
    """Partials and self-resetting arrival counters, grown on demand."""
    key = (device.index or 0, stream)
    have = _SCRATCH.get(key)
    if have is None or have[3].shape[0] < rows:
        cap = max(rows, 64 if have is None else 2 * have[3].shape[0])
        have = (
            torch.empty(cap * MAX_SPLITS, dtype=torch.float32, device=device),
            torch.empty(cap * MAX_SPLITS, dtype=torch.float32, device=device),
            torch.empty(cap * MAX_SPLITS, dtype=torch.int32, device=device),
            torch.zeros(cap, dtype=torch.int32, device=device),
        )
        _SCRATCH[key] = have
    return have


def _sm_count(device: torch.device) -> int:
    # the interpreter on CPU has no SMs: any small grid exercises the combine
    return describe(device).num_sms or 8


def launch_plan(rows: int, n_cols: int, dev: DeviceInfo, config: Config | None = None
                ) -> tuple[int, tuple, int]:
    """(splits per row, the kernel's trailing arguments from split_cols on, num_warps) of the
    launch for a [rows, n_cols] block on a device described by ``dev``."""
    cfg = config or plan_config(rows, n_cols, dev)
    split_cols, nsplit = split_plan(rows, max(n_cols, 1), dev.num_sms or 8, cfg.block,
                                    cfg.programs_per_sm, cfg.unroll)
    return nsplit, (split_cols, cfg.block, cfg.unroll, MAX_SPLITS, cfg.stages), cfg.num_warps


def _launch(logits: torch.Tensor, n_valid: int, config: Config | None = None, packed: bool = False):
    """``config`` None = the device table's (or the default) for this batch. ``packed``: returns
    ``draft_top1``'s (token, host row) instead of (max, sum-exp, argmax)."""
    if triton is None:
        raise RuntimeError("the draft_confidence Triton kernel needs triton")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, n_cols = logits.shape
    dev = logits.device
    out_idx = torch.empty(rows, dtype=torch.int64, device=dev)
    if packed:  # the host row takes the max's place (the kernel writes no sums)
        out_max = out_sum = torch.empty(2 * rows, dtype=torch.int32, device=dev)
    else:
        out_max = torch.empty(rows, dtype=torch.float32, device=dev)
        out_sum = torch.empty(rows, dtype=torch.float32, device=dev)
    if rows == 0:
        return (out_idx, out_max) if packed else (out_max, out_sum, out_idx)
    n_valid = n_cols if n_valid < 0 else min(n_valid, n_cols)
    stride = logits.stride(0)
    on_cuda = dev.type == "cuda"
    stream = torch._C._cuda_getCurrentRawStream(dev.index) if on_cuda else 0
    # Everything Triton specialises on (alignment, divisibility by 16, == 1) is a function of
    # this key, so a compiled kernel found under it is the one the JIT would pick.
    key = (rows, n_cols, stride, n_valid, logits.dtype, dev.index, stream,
           logits.data_ptr() % 16 == 0, config, packed)
    plan = _LAUNCHES.get(key)
    if plan is None:  # the launch sits on the per-slot hot path: plan once per call signature
        nsplit, tail, warps = launch_plan(rows, n_cols, describe(dev), config)
        # (grid, scratch (kept alive here: a grown _SCRATCH replaces it), trailing args, warps)
        plan = _LAUNCHES[key] = (nsplit, _scratch(dev, stream, rows), tail, warps)
    nsplit, scratch, tail, warps = plan
    _draft_confidence_kernel[(rows, nsplit)](
        logits, stride, n_valid, *scratch, out_max, out_sum, out_idx, *tail, packed, num_warps=warps,
    )
    return (out_idx, out_max) if packed else (out_max, out_sum, out_idx)


def draft_top1_reference(logits: torch.Tensor, n_valid: int = -1
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token int64 [B], host row int32 [2B]) of ``logits[:, :n_valid]``: the greedy token
    (``argmax``) and the draft slot's row for the host, the token ids then the bits of their
    fp32 probabilities ``1 / sum-exp`` (the TP=1 draft slot: the capture and its packing in one
    launch, the row ready for one copy)."""
    _, total, idx = draft_confidence_reference(logits, n_valid)
    return idx, torch.cat([idx.to(torch.int32), (1.0 / total).view(torch.int32)])


def draft_top1_triton(logits: torch.Tensor, n_valid: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel; same contract as ``draft_top1_reference`` (the probability divides
    with IEEE rounding, as torch does)."""
    return _launch(logits, n_valid, packed=True)


def draft_confidence_triton(logits: torch.Tensor, n_valid: int = -1
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernel; same contract as ``draft_confidence_reference``."""
    return _launch(logits, n_valid)


# --- the op (dispatch.register_library_op) --------------------------------------------------

def _draft_confidence_gpu(logits: torch.Tensor, n_valid: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if triton is None:
        return draft_confidence_reference(logits, n_valid)
    return draft_confidence_triton(logits, n_valid)


def _draft_confidence_cpu(logits: torch.Tensor, n_valid: int
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return draft_confidence_reference(logits, n_valid)


def _draft_confidence_fake(logits, n_valid):
    rows = logits.shape[0]
    return (logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.int64))


_OP = register_library_op("draft_confidence", _draft_confidence_cpu, _draft_confidence_gpu,
                          _draft_confidence_fake)


def draft_confidence(logits: torch.Tensor, n_valid: int = -1
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(max, sum-exp, argmax) per row of ``logits[:, :n_valid]``; Triton on GPU, reference on CPU.

    The top-1 probability is ``1 / sum-exp``; across shards combine with
    ``radiance.draft.local_vocab.combine_partials``.

    In eager mode a plain CUDA tensor goes straight to the launcher (the dispatcher's few
    microseconds are a share of a launch that takes ~10 on the H200 host). Traced code
    (torch.compile) and tensor subclasses (fake tensors) go through
    ``torch.ops.radiance.draft_confidence``.
    """
    if eager_gpu_call(logits):
        return draft_confidence_triton(logits, n_valid)
    return _OP(logits, n_valid)


def _draft_top1_gpu(logits: torch.Tensor, n_valid: int) -> tuple[torch.Tensor, torch.Tensor]:
    if triton is None:
        return draft_top1_reference(logits, n_valid)
    return draft_top1_triton(logits, n_valid)


def _draft_top1_cpu(logits: torch.Tensor, n_valid: int) -> tuple[torch.Tensor, torch.Tensor]:
    return draft_top1_reference(logits, n_valid)


def _draft_top1_fake(logits, n_valid):
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.int64), logits.new_empty(2 * rows, dtype=torch.int32)


_TOP1_OP = register_library_op("draft_top1", _draft_top1_cpu, _draft_top1_gpu, _draft_top1_fake)


def draft_top1(logits: torch.Tensor, n_valid: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, host row) of ``logits[:, :n_valid]`` (``draft_top1_reference``); Triton on GPU,
    reference on CPU, eager CUDA tensors straight to the launcher as in ``draft_confidence``."""
    if eager_gpu_call(logits):
        return draft_top1_triton(logits, n_valid)
    return _TOP1_OP(logits, n_valid)


# --- ahead-of-time launches (radiance.kernels.aot) ----------------------------------------

def _aot_launches(dev: DeviceInfo, arch: str):
    # shards: the TP>1 per-rank stats; whole vocabularies: the TP=1 packed slot (draft_top1), and
    # the stats of the gathered rows where a TP>1 head cannot be read by shard
    for cols in shipped.DRAFT_VOCAB_SHARDS + shipped.DRAFT_VOCAB_FULL:
        first: dict[Config, int] = {}
        for rows in range(1, shipped.DRAFT_ROWS + 1):
            first.setdefault(plan_config(rows, cols, dev), rows)
        for packed in (False, True) if cols in shipped.DRAFT_VOCAB_FULL else (False,):
            for rows in first.values():
                name = f"B={rows} V={cols}" + (" packed" if packed else "")
                yield name, functools.partial(_aot_call, rows, cols, packed)


def _aot_call(rows: int, cols: int, packed: bool) -> None:
    _launch(torch.empty((rows, cols), dtype=torch.bfloat16), cols, packed=packed)


if triton is not None:
    aot.register("draft_confidence", "dynamic_draft", _aot_launches)
