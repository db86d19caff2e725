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
not bandwidth, sets the time. The counters reset themselves, so they are allocated once.

Ties resolve to the lowest column, like ``torch.argmax``; the sum's order differs from the
reference, so sum-exp agrees to fp32 rounding, max and argmax exactly.
"""
from __future__ import annotations

import math

import torch

from . import aot
from .dispatch import use_triton

try:  # Triton is optional: a CPU-only install runs the reference
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

# Partials a row may be split into; the combine reads this many slots (masked), so it is a
# compile-time size and also the cap on the split count the launcher picks.
MAX_SPLITS = 64
# Launch defaults, from benchmarks/bench_draft_confidence.py --tune on an H200 (2026-11-29,
# device time over cold-L2 inputs; see docs/benchmarks.md): the one-pass online reduction with
# 4096-column tiles, 4 warps and about 8 programs per SM was the fastest measured config at both
# B=8 (5.6 us) and B=64 (18.6 us); the two-pass variant was within 6%.
BLOCK = 4096
NUM_WARPS = 4
# Programs the launcher aims for per SM: enough resident programs to cover HBM latency at small B.
PROGRAMS_PER_SM = 8
# Reduction scheme: two passes over each split (per-lane max, then one exp per element) or one
# online pass (rescaled sum, a cross-lane reduction per tile). The benchmark's --tune compares.
TWO_PASS = False


if triton is not None:

    @triton.jit
    def _draft_confidence_kernel(
        logits_ptr, stride_row, n_valid,
        part_max_ptr, part_sum_ptr, part_idx_ptr, count_ptr,
        out_max_ptr, out_sum_ptr, out_idx_ptr,
        split_cols,
        BLOCK: tl.constexpr,
        NSPLIT_P2: tl.constexpr,
        TWO_PASS: tl.constexpr,
    ):
        row = tl.program_id(0)
        split = tl.program_id(1)
        nsplit = tl.num_programs(1)
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        offs = tl.arange(0, BLOCK)
        start = split * split_cols
        neg_inf = float("-inf")

        if TWO_PASS:
            # Pass 1: per-lane max and its first column, no cross-lane work inside the loop.
            # Pass 2 re-reads the split (from L2: pass 1 asked to keep it) for one exp per
            # element. Cheaper than the online rescale's two exps and a reduction per tile.
            m_vec = tl.full((BLOCK,), neg_inf, tl.float32)
            i_vec = tl.full((BLOCK,), 0, tl.int32) + start
            for t in range(0, split_cols, BLOCK):
                cols = start + t + offs
                x = tl.load(row_ptr + cols, mask=cols < n_valid, other=neg_inf,
                            eviction_policy="evict_last").to(tl.float32)
                gt = x > m_vec  # strictly: a lane keeps its earliest column on a tie
                i_vec = tl.where(gt, cols, i_vec)
                m_vec = tl.where(gt, x, m_vec)
            m = tl.max(m_vec, 0)
            idx = tl.min(tl.where(m_vec == m, i_vec, 2147483647), 0)
            base = tl.where(m == neg_inf, 0.0, m)
            s_vec = tl.zeros((BLOCK,), tl.float32)
            for t in range(0, split_cols, BLOCK):
                cols = start + t + offs
                x = tl.load(row_ptr + cols, mask=cols < n_valid, other=neg_inf,
                            eviction_policy="evict_first").to(tl.float32)
                s_vec += tl.exp(x - base)
            s = tl.sum(s_vec, 0)
        else:
            m = tl.full((), neg_inf, tl.float32)
            s = tl.full((), 0.0, tl.float32)
            idx = start  # an all -inf split reports its first column, like torch.argmax would
            for t in range(0, split_cols, BLOCK):
                cols = start + t + offs
                if start + t + BLOCK <= n_valid:
                    # unmasked: 16-byte loads whatever n_valid's alignment
                    x = tl.load(row_ptr + cols).to(tl.float32)
                else:
                    x = tl.load(row_ptr + cols, mask=cols < n_valid, other=neg_inf).to(tl.float32)
                tmax, targ = tl.max(x, 0, return_indices=True)
                m_new = tl.maximum(m, tmax)
                # exp(-inf - -inf) is NaN: rebase on 0 while nothing finite has been seen.
                base = tl.where(m_new == neg_inf, 0.0, m_new)
                s = s * tl.exp(m - base) + tl.sum(tl.exp(x - base), 0)
                # strictly greater: an earlier tile keeps a tie, so the lowest column wins
                idx = tl.where(tmax > m, start + t + targ, idx)
                m = m_new

        part = row * NSPLIT_P2 + split
        tl.store(part_max_ptr + part, m)
        tl.store(part_sum_ptr + part, s)
        tl.store(part_idx_ptr + part, idx)
        # Every thread's partial store must precede the arrival that publishes it.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
        if arrived == nsplit - 1:
            k = tl.arange(0, NSPLIT_P2)
            live = k < nsplit
            # volatile: the other programs' partials must come from L2, not a stale L1 line
            pm = tl.load(part_max_ptr + row * NSPLIT_P2 + k, mask=live, other=neg_inf, volatile=True)
            ps = tl.load(part_sum_ptr + row * NSPLIT_P2 + k, mask=live, other=0.0, volatile=True)
            pi = tl.load(part_idx_ptr + row * NSPLIT_P2 + k, mask=live, other=2147483647,
                         volatile=True)
            big_m = tl.max(pm, 0)
            base = tl.where(big_m == neg_inf, 0.0, big_m)
            total = tl.sum(ps * tl.exp(pm - base), 0)
            best = tl.min(tl.where(live & (pm == big_m), pi, 2147483647), 0)
            tl.store(out_max_ptr + row, big_m)
            tl.store(out_sum_ptr + row, total)
            tl.store(out_idx_ptr + row, best.to(tl.int64))
            tl.store(count_ptr + row, 0)  # ready for the next launch on this stream

    for _dtype in ("bf16", "fp16", "fp32"):
        aot.register(aot.AotSpec(
            name=f"draft_confidence[{_dtype},BLOCK{BLOCK},{'2pass' if TWO_PASS else 'online'}]",
            feature="dynamic_draft",
            kernel=_draft_confidence_kernel,
            signature={
                "logits_ptr": f"*{_dtype}", "stride_row": "i32", "n_valid": "i32",
                "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32", "part_idx_ptr": "*i32",
                "count_ptr": "*i32",
                "out_max_ptr": "*fp32", "out_sum_ptr": "*fp32", "out_idx_ptr": "*i64",
                "split_cols": "i32", "BLOCK": "constexpr", "NSPLIT_P2": "constexpr",
                "TWO_PASS": "constexpr",
            },
            constexprs={"BLOCK": BLOCK, "NSPLIT_P2": MAX_SPLITS, "TWO_PASS": TWO_PASS},
            num_warps=NUM_WARPS,
        ))


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


# --- Triton launcher -----------------------------------------------------------------------

_SCRATCH: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_SM_COUNT: dict[torch.device, int] = {}
_PLANS: dict[tuple, tuple[int, int]] = {}


def _scratch(device: torch.device, rows: int):
    """Partials and self-resetting arrival counters, grown on demand, kept per device."""
    have = _SCRATCH.get(device)
    if have is None or have[3].shape[0] < rows:
        cap = max(rows, 64 if have is None else 2 * have[3].shape[0])
        have = (
            torch.empty(cap * MAX_SPLITS, dtype=torch.float32, device=device),
            torch.empty(cap * MAX_SPLITS, dtype=torch.float32, device=device),
            torch.empty(cap * MAX_SPLITS, dtype=torch.int32, device=device),
            torch.zeros(cap, dtype=torch.int32, device=device),
        )
        _SCRATCH[device] = have
    return have


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # the interpreter on CPU: any small grid exercises the combine
    n = _SM_COUNT.get(device)
    if n is None:
        n = _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def split_plan(rows: int, n_cols: int, sm_count: int, block: int = BLOCK,
               programs_per_sm: int = PROGRAMS_PER_SM) -> tuple[int, int]:
    """(columns per split, number of splits): about ``programs_per_sm`` programs per SM in all,
    each split a whole number of blocks, at most MAX_SPLITS splits."""
    want = max(1, min(MAX_SPLITS, math.ceil(programs_per_sm * sm_count / max(rows, 1))))
    tiles = max(1, math.ceil(n_cols / block))
    per_split = max(1, math.ceil(tiles / want))
    nsplit = math.ceil(tiles / per_split)
    if nsplit > MAX_SPLITS:  # a vocabulary too wide for MAX_SPLITS at this block size
        per_split = math.ceil(tiles / MAX_SPLITS)
        nsplit = math.ceil(tiles / per_split)
    return per_split * block, nsplit


def _launch(logits: torch.Tensor, n_valid: int, block: int, num_warps: int, programs_per_sm: int,
            two_pass: bool = TWO_PASS):
    if triton is None:
        raise RuntimeError("the draft_confidence Triton kernel needs triton")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, n_cols = logits.shape
    n_valid = n_cols if n_valid < 0 else min(n_valid, n_cols)
    out_max = torch.empty(rows, dtype=torch.float32, device=logits.device)
    out_sum = torch.empty(rows, dtype=torch.float32, device=logits.device)
    out_idx = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out_max, out_sum, out_idx
    key = (rows, n_cols, logits.device, block, programs_per_sm)
    plan = _PLANS.get(key)
    if plan is None:  # the launch sits on the per-slot hot path: no arithmetic twice
        plan = _PLANS[key] = split_plan(rows, max(n_cols, 1), _sm_count(logits.device), block,
                                        programs_per_sm)
    split_cols, nsplit = plan
    pmax, psum, pidx, count = _scratch(logits.device, rows)
    _draft_confidence_kernel[(rows, nsplit)](
        logits, logits.stride(0), n_valid,
        pmax, psum, pidx, count,
        out_max, out_sum, out_idx,
        split_cols,
        BLOCK=block, NSPLIT_P2=MAX_SPLITS, TWO_PASS=two_pass, num_warps=num_warps,
    )
    return out_max, out_sum, out_idx


def draft_confidence_triton(logits: torch.Tensor, n_valid: int = -1
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton kernel; same contract as ``draft_confidence_reference``."""
    return _launch(logits, n_valid, BLOCK, NUM_WARPS, PROGRAMS_PER_SM)


# --- the op --------------------------------------------------------------------------------

@torch.library.custom_op("radiance::draft_confidence", mutates_args=())
def _draft_confidence_op(logits: torch.Tensor, n_valid: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if use_triton(logits):
        return draft_confidence_triton(logits, n_valid)
    return draft_confidence_reference(logits, n_valid)


@_draft_confidence_op.register_fake
def _draft_confidence_fake(logits: torch.Tensor, n_valid: int):
    rows = logits.shape[0]
    return (logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.float32),
            logits.new_empty(rows, dtype=torch.int64))


def draft_confidence(logits: torch.Tensor, n_valid: int = -1
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(max, sum-exp, argmax) per row of ``logits[:, :n_valid]``; Triton on GPU, reference on CPU.

    The top-1 probability is ``1 / sum-exp``; across shards combine with
    ``radiance.draft.local_vocab.combine_partials``.
    """
    return torch.ops.radiance.draft_confidence(logits, n_valid)
