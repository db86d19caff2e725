"""Where draft_confidence's fixed cost goes: variants of the kernel that leave one stage out or do
it another way, timed like bench_draft_confidence's ``gpu`` column (CUDA-graph replays over
rotating inputs larger than L2), at the tuned table's config for each batch.

    python benchmarks/bench_draft_confidence_tail.py [--bs 1,8,64] [--rounds 3]

Across B = 16..128 the shipped kernel's time fits ``F + bytes / R`` with R ~ 3.85 TB/s and
F ~ 4.6 us (docs/benchmarks.md), and F is what keeps B=64 under 70% of copy bandwidth. Variants
(the first three compute garbage and are only timed; the others are checked exact first):
  no_loop      an empty column range: launch + end reductions + arrival + combine
  no_combine   partials written, no arrival atomic, no combine
  no_end       the loop, then only the lane max reduced and stored (no arrival)
  shipped      the module's kernel (three end reductions, acq_rel arrival, combine)
  fused_end    the end and the combine each as one tuple reduction (online max / sum-exp / first
               argmax combine) instead of max, then sum and min
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_draft_confidence import V, check, gpu_us, inputs  # noqa: E402

from radiance.kernels import draft_confidence as dc  # noqa: E402
from radiance.kernels.draft_confidence import (  # noqa: E402
    _arrive_and_combine,
    _fold_split,
    _lanes_to_partial,
    _load_partials,
    _publish_partial,
    _store_row,
)

VARIANTS = ("no_loop", "no_combine", "no_end", "shipped", "fused_end")


@triton.jit
def _lse_combine(m1, s1, i1, m2, s2, i2):
    big = tl.maximum(m1, m2)
    # a side at the max keeps its sum as is (also when both are -inf: no -inf - -inf)
    e1 = tl.where(m1 == big, 1.0, tl.exp(m1 - big))
    e2 = tl.where(m2 == big, 1.0, tl.exp(m2 - big))
    i = tl.where(m1 > m2, i1, tl.where(m2 > m1, i2, tl.minimum(i1, i2)))
    return big, s1 * e1 + s2 * e2, i


@triton.jit
def _variant_kernel(logits_ptr, stride_row, n_valid, part_max_ptr, part_sum_ptr, part_idx_ptr,
                    count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr, split_cols,
                    BLOCK: tl.constexpr, UNROLL: tl.constexpr, NSPLIT_P2: tl.constexpr,
                    STAGES: tl.constexpr, VARIANT: tl.constexpr):
    # The shipped kernel's pieces (bf16 logits only), with one stage left out or replaced.
    row = tl.program_id(0)
    split = tl.program_id(1)
    nsplit = tl.num_programs(1)
    start = split * split_cols
    stop = tl.minimum(start + split_cols, n_valid)
    if VARIANT == 0:  # no_loop: an empty column range, so nothing is loaded or folded
        stop = start
    m_vec, s_vec, t_vec = _fold_split(logits_ptr + row.to(tl.int64) * stride_row, start, stop,
                                      BLOCK, UNROLL, STAGES, False)
    part = row * NSPLIT_P2 + split
    if VARIANT == 2:  # no_end: one reduction, no arrival
        tl.store(part_max_ptr + part, tl.max(m_vec, 0))
    elif VARIANT == 4:  # fused_end: one tuple reduction for the end and one for the combine
        m, s, idx = tl.reduce((m_vec, s_vec, t_vec + tl.arange(0, BLOCK)), 0, _lse_combine)
        if _publish_partial(m, s, idx, row, split, nsplit, part_max_ptr, part_sum_ptr,
                            part_idx_ptr, count_ptr, NSPLIT_P2):
            pm, ps, pi, _ = _load_partials(row, nsplit, part_max_ptr, part_sum_ptr, part_idx_ptr,
                                           NSPLIT_P2)
            big_m, total, best = tl.reduce((pm, ps, pi), 0, _lse_combine)
            _store_row(big_m, total, best, row, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr)
    else:
        m, s, idx = _lanes_to_partial(m_vec, s_vec, t_vec, BLOCK)
        if VARIANT == 1:  # no_combine: partials stored, no arrival
            tl.store(part_max_ptr + part, m)
            tl.store(part_sum_ptr + part, s)
            tl.store(part_idx_ptr + part, idx)
        else:
            _arrive_and_combine(m, s, idx, row, split, nsplit, part_max_ptr, part_sum_ptr,
                                part_idx_ptr, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                                NSPLIT_P2)


def launcher(b: int, variant: str):
    dev = torch.device("cuda")
    cfg = dc.config_for(b, dev)
    split_cols, nsplit = dc.split_plan(b, V, dc._sm_count(dev), cfg.block, cfg.programs_per_sm, cfg.unroll)
    scratch = dc._scratch(dev, torch.cuda.current_stream().cuda_stream, b)
    code = VARIANTS.index(variant)

    def run(x):
        out = (torch.empty(b, dtype=torch.float32, device=dev), torch.empty(b, dtype=torch.float32, device=dev),
               torch.empty(b, dtype=torch.int64, device=dev))
        if variant == "shipped":
            return dc._launch(x, -1, cfg)
        _variant_kernel[(b, nsplit)](x, x.stride(0), V, *scratch, *out, split_cols, BLOCK=cfg.block,
                                     UNROLL=cfg.unroll, NSPLIT_P2=dc.MAX_SPLITS, STAGES=cfg.stages,
                                     VARIANT=code, num_warps=cfg.num_warps)
        return out
    return run, cfg, nsplit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bs", default="1,8,64")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    for b in [int(x) for x in args.bs.split(",")]:
        bufs = inputs(b, torch.bfloat16)
        want = dc.draft_confidence_reference(bufs[0], -1)
        runs = {}
        for v in VARIANTS:
            run, cfg, nsplit = launcher(b, v)
            got = run(bufs[0])
            torch.cuda.synchronize()
            if v in ("shipped", "fused_end"):
                check(got, want)
            runs[v] = run
        times = {v: [] for v in VARIANTS}
        for _ in range(args.rounds):
            for v, run in runs.items():
                times[v].append(gpu_us(lambda buf, run=run: (lambda: run(buf)), bufs, reps=50))
        event = {v: statistics.median(
            triton.testing.do_bench(lambda run=runs[v]: run(bufs[0]), warmup=25, rep=100,
                                    return_mode="median") * 1e3 for _ in range(args.rounds))
            for v in ("shipped", "fused_end")}
        print(f"B={b} config {cfg.as_dict()} nsplit {nsplit} programs {b * nsplit}", flush=True)
        for v in VARIANTS:
            t = statistics.median(times[v])
            ev = f"  event {event[v]:6.2f} us" if v in event else ""
            print(f"  {v:11s} gpu {t:7.2f} us{ev}  {[round(x, 2) for x in times[v]]}", flush=True)
        del bufs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
