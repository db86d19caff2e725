"""Benchmark: draft_confidence layouts that drop or shorten the split reduction's arrival + combine.

The shipped kernel cuts every row into splits and the row's last program combines the partials
(a fence, an atomic round trip, a reload): 1.3-1.4 us at every batch size
(``bench_draft_confidence_tail.py``). Variants timed here against the shipped launch (gpu time:
CUDA-graph replays over rotating inputs larger than L2):

  shipped      the launcher with the device table's config
  row          one program per row, the whole row in one CTA (up to 32 warps, deep pipelining):
               no partials, no atomic, no combine; needs enough rows to fill the GPU's bandwidth
  splitN       the shipped kernel with exactly N splits per row and a large CTA
  strided      the shipped split kernel, but program ``split`` of a row takes chunks split,
               split + nsplit, ... (neighbouring programs read neighbouring chunks)
  amax / copy  torch references for the bandwidth a single-pass read (write) reaches at this size
  lean         the split kernel with a fold that takes a chunk's max (and first tile) first, then
               rescales the lane once and adds one exp per element against the new max (``+fma``:
               the exponent as one FFMA, x * log2e - m * log2e)
  empty        an empty kernel over grids of 8 .. 2112 one-warp programs (the dispatch cost)

    python benchmarks/bench_draft_confidence_rows.py [--bs 8,64,128] [--layouts] [--lean] [--empty]
        [--json out.json]
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radiance.kernels import draft_confidence as dc  # noqa: E402

import bench_draft_confidence as bdc  # noqa: E402
from _fp8_epilogue_common import empty_launch  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROW_CONFIGS = [  # (block, warps, unroll, stages)
    (b, w, u, s)
    for (b, w), u, s in itertools.product([(2048, 8), (4096, 16), (8192, 32), (4096, 8), (8192, 16)],
                                          [1, 2, 4], [1, 2, 3, 4])
]


@triton.jit
def _row_kernel(logits_ptr, stride_row, n_valid, out_max_ptr, out_sum_ptr, out_idx_ptr,
                BLOCK: tl.constexpr, UNROLL: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0)
    m_vec, s_vec, t_vec = dc._fold_split(logits_ptr + row.to(tl.int64) * stride_row, 0, n_valid,
                                         BLOCK, UNROLL, STAGES,
                                         logits_ptr.dtype.element_ty == tl.float32)
    m, s, idx = dc._lanes_to_partial(m_vec, s_vec, t_vec, BLOCK)
    tl.store(out_max_ptr + row, m)
    tl.store(out_sum_ptr + row, s)
    tl.store(out_idx_ptr + row, idx.to(tl.int64))


@triton.jit
def _fold_strided(row_ptr, split, nsplit, n_valid, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                  STAGES: tl.constexpr, GUARD: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    CHUNK: tl.constexpr = BLOCK * UNROLL
    n_full = n_valid // CHUNK
    m_vec, s_vec, t_vec = dc._lanes_init(split * CHUNK, BLOCK, GUARD)
    for c in tl.range(split, n_full, nsplit, num_stages=STAGES):
        t = c * CHUNK
        xa, xb, xc, xd = dc._load_chunk(row_ptr + t + offs, None, BLOCK, UNROLL)
        m_vec, s_vec, t_vec = dc._fold_chunk(xa, xb, xc, xd, t, m_vec, s_vec, t_vec, BLOCK,
                                             UNROLL, GUARD)
    return dc._fold_ragged(row_ptr, n_full * CHUNK + split * BLOCK, n_valid, nsplit * BLOCK,
                           m_vec, s_vec, t_vec, BLOCK, GUARD)


@triton.jit
def _strided_kernel(logits_ptr, stride_row, n_valid, part_max_ptr, part_sum_ptr, part_idx_ptr,
                    count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                    BLOCK: tl.constexpr, UNROLL: tl.constexpr, NSPLIT_P2: tl.constexpr,
                    STAGES: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    m_vec, s_vec, t_vec = _fold_strided(logits_ptr + row.to(tl.int64) * stride_row, split,
                                        tl.num_programs(1), n_valid, BLOCK, UNROLL, STAGES,
                                        logits_ptr.dtype.element_ty == tl.float32)
    m, s, idx = dc._lanes_to_partial(m_vec, s_vec, t_vec, BLOCK)
    dc._arrive_and_combine(m, s, idx, row, split, tl.num_programs(1), part_max_ptr, part_sum_ptr,
                           part_idx_ptr, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                           NSPLIT_P2)


@triton.jit
def _lean_chunk(xs0, xs1, xs2, xs3, t, m_vec, s_vec, t_vec, BLOCK: tl.constexpr,
                GUARD: tl.constexpr, FMA: tl.constexpr):
    """Four tiles: their max and first tile first, one rescale of the lane, then one exp per
    element against the lane's new max (no per-element select on the sum)."""
    LOG2E: tl.constexpr = 1.4426950408889634
    x0 = xs0.to(tl.float32)
    x1 = xs1.to(tl.float32)
    x2 = xs2.to(tl.float32)
    x3 = xs3.to(tl.float32)
    cm = x0
    ti = tl.zeros_like(t_vec)
    g = x1 > cm
    cm = tl.maximum(cm, x1)
    ti = tl.where(g, 1, ti)
    g = x2 > cm
    cm = tl.maximum(cm, x2)
    ti = tl.where(g, 2, ti)
    g = x3 > cm
    cm = tl.maximum(cm, x3)
    ti = tl.where(g, 3, ti)
    up = cm > m_vec
    m_new = tl.maximum(m_vec, cm)
    if FMA:  # exp2(x * log2e - m * log2e): one FFMA per element, m * log2e rounded once
        ml = m_new * LOG2E
        r = tl.exp2(m_vec * LOG2E - ml)
        e0 = tl.exp2(x0 * LOG2E - ml)
        e1 = tl.exp2(x1 * LOG2E - ml)
        e2 = tl.exp2(x2 * LOG2E - ml)
        e3 = tl.exp2(x3 * LOG2E - ml)
    else:
        r = tl.exp2((m_vec - m_new) * LOG2E)
        e0 = tl.exp2((x0 - m_new) * LOG2E)
        e1 = tl.exp2((x1 - m_new) * LOG2E)
        e2 = tl.exp2((x2 - m_new) * LOG2E)
        e3 = tl.exp2((x3 - m_new) * LOG2E)
    if GUARD:
        r = tl.where(m_new > float("-inf"), r, 0.0)
    t_vec = tl.where(up, t + ti * BLOCK, t_vec)
    if GUARD:
        e0 = tl.where(x0 > float("-inf"), e0, 0.0)
        e1 = tl.where(x1 > float("-inf"), e1, 0.0)
        e2 = tl.where(x2 > float("-inf"), e2, 0.0)
        e3 = tl.where(x3 > float("-inf"), e3, 0.0)
    s_vec = s_vec * r + ((e0 + e1) + (e2 + e3))
    return m_new, s_vec, t_vec


@triton.jit
def _fold_lean(row_ptr, start, stop, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
               STAGES: tl.constexpr, GUARD: tl.constexpr, FMA: tl.constexpr):
    """_fold_split with chunks of 4 or 8 tiles folded by _lean_chunk."""
    offs = tl.arange(0, BLOCK)
    CHUNK: tl.constexpr = BLOCK * UNROLL
    n_full = tl.maximum(stop - start, 0) // CHUNK
    m_vec, s_vec, t_vec = dc._lanes_init(start, BLOCK, GUARD)
    for c in tl.range(0, n_full, num_stages=STAGES):
        t = start + c * CHUNK
        xa, xb, xc, xd = dc._load_chunk(row_ptr + t + offs, None, BLOCK, 4)
        if UNROLL == 8:
            xe, xf, xg, xh = dc._load_chunk(row_ptr + t + 4 * BLOCK + offs, None, BLOCK, 4)
            m_vec, s_vec, t_vec = _lean_chunk(xa, xb, xc, xd, t, m_vec, s_vec, t_vec, BLOCK,
                                              GUARD, FMA)
            m_vec, s_vec, t_vec = _lean_chunk(xe, xf, xg, xh, t + 4 * BLOCK, m_vec, s_vec,
                                              t_vec, BLOCK, GUARD, FMA)
        else:
            m_vec, s_vec, t_vec = _lean_chunk(xa, xb, xc, xd, t, m_vec, s_vec, t_vec, BLOCK,
                                              GUARD, FMA)
    return dc._fold_ragged(row_ptr, start + n_full * CHUNK, stop, BLOCK, m_vec, s_vec, t_vec,
                           BLOCK, GUARD)


@triton.jit
def _lean_kernel(logits_ptr, stride_row, n_valid, part_max_ptr, part_sum_ptr, part_idx_ptr,
                 count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr, split_cols,
                 BLOCK: tl.constexpr, UNROLL: tl.constexpr, NSPLIT_P2: tl.constexpr,
                 STAGES: tl.constexpr, FMA: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    start = split * split_cols
    m_vec, s_vec, t_vec = _fold_lean(logits_ptr + row.to(tl.int64) * stride_row, start,
                                     tl.minimum(start + split_cols, n_valid), BLOCK, UNROLL,
                                     STAGES, logits_ptr.dtype.element_ty == tl.float32, FMA)
    m, s, idx = dc._lanes_to_partial(m_vec, s_vec, t_vec, BLOCK)
    dc._arrive_and_combine(m, s, idx, row, split, tl.num_programs(1), part_max_ptr, part_sum_ptr,
                           part_idx_ptr, count_ptr, out_max_ptr, out_sum_ptr, out_idx_ptr,
                           NSPLIT_P2)


def lean_call(cfg, fma=False):
    """cfg = (block, warps, unroll, stages, programs_per_sm)"""
    block, warps, unroll, stages, pps = cfg

    def make(x):
        o = outs(x)
        rows, n = x.shape
        scratch = dc._scratch(x.device, torch.cuda.current_stream().cuda_stream, rows)
        split_cols, ns = dc.split_plan(rows, n, dc._sm_count(x.device), block, pps, unroll)

        def call():
            _lean_kernel[(rows, ns)](x, x.stride(0), n, *scratch, *o, split_cols, BLOCK=block,
                                     UNROLL=unroll, NSPLIT_P2=dc.MAX_SPLITS, STAGES=stages,
                                     FMA=fma, num_warps=warps)
            return o
        return call
    return make


LEAN_CONFIGS = [(b, w, u, s, pps) for (b, w), u, s, pps in itertools.product(
    [(256, 1), (512, 2)], [4, 8], [2, 3, 4], [8, 12, 16])]


def outs(x):
    b = x.shape[0]
    return (torch.empty(b, dtype=torch.float32, device=x.device),
            torch.empty(b, dtype=torch.float32, device=x.device),
            torch.empty(b, dtype=torch.int64, device=x.device))


def row_call(cfg):
    block, warps, unroll, stages = cfg

    def make(x):
        o = outs(x)

        def call():
            _row_kernel[(x.shape[0],)](x, x.stride(0), x.shape[1], *o, BLOCK=block, UNROLL=unroll,
                                       STAGES=stages, num_warps=warps)
            return o
        return call
    return make


def split_call(nsplit, cfg, strided=False):
    block, warps, unroll, stages = cfg

    def make(x):
        o = outs(x)
        rows, n = x.shape
        scratch = dc._scratch(x.device, torch.cuda.current_stream().cuda_stream, rows)
        chunk = block * unroll
        split_cols = math.ceil(math.ceil(n / chunk) / nsplit) * chunk
        ns = nsplit if strided else math.ceil(n / split_cols)

        def call():
            if strided:
                _strided_kernel[(rows, ns)](x, x.stride(0), n, *scratch, *o, BLOCK=block,
                                            UNROLL=unroll, NSPLIT_P2=dc.MAX_SPLITS, STAGES=stages,
                                            num_warps=warps)
            else:
                dc._draft_confidence_kernel[(rows, ns)](
                    x, x.stride(0), n, *scratch, *o, split_cols, BLOCK=block, UNROLL=unroll,
                    NSPLIT_P2=dc.MAX_SPLITS, STAGES=stages, num_warps=warps)
            return o
        return call
    return make


def strided_shipped(b):
    cfg = dc.config_for(b, torch.device("cuda"))
    _, nsplit = dc.split_plan(b, bdc.V, dc._sm_count(torch.device("cuda")), cfg.block,
                              cfg.programs_per_sm, cfg.unroll)
    return nsplit, (cfg.block, cfg.num_warps, cfg.unroll, cfg.stages)


def timed(name, b, make, bufs, bw, rounds, results, check=True):
    try:
        if check:
            got = make(bufs[0])()
            torch.cuda.synchronize()
            bdc.check(got, dc.draft_confidence_reference(bufs[0], -1))
        us = sorted(bdc.gpu_us(make, bufs) for _ in range(rounds))[rounds // 2]
    except Exception as exc:
        print(f"  {name} B={b}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return None
    nbytes = bufs[0].numel() * bufs[0].element_size()
    r = {"variant": name, "B": b, "us": us, "frac_copy_bw": nbytes / (us * 1e-6) / bw}
    results.append(r)
    print(f"  {name:44s} B={b:4d} {us:8.2f} us {100 * r['frac_copy_bw']:6.1f}%", flush=True)
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bs", default="8,64,128")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--layouts", action="store_true", help="row / splitN / strided variants")
    p.add_argument("--lean", action="store_true", help="the lean fold over LEAN_CONFIGS")
    p.add_argument("--empty", action="store_true", help="empty one-warp grids of several sizes")
    p.add_argument("--low-pps", action="store_true",
                   help="the shipped kernel with 1-3 programs per SM (below the tune space)")
    p.add_argument("--full-row-sweep", action="store_true", help="every ROW_CONFIGS entry")
    p.add_argument("--ncu", action="store_true",
                   help="only launch the shipped kernel and two row configs 3x at B=64 (a driver "
                        "for ncu --kernel-name regex:'draft_confidence_kernel|_row_kernel')")
    args = p.parse_args(argv)
    if args.ncu:
        x = (torch.randn(64, bdc.V, device="cuda") * 4).to(torch.bfloat16)
        for _ in range(3):
            dc._launch(x, -1)
            row_call((8192, 32, 2, 3))(x)()
            row_call((4096, 16, 4, 3))(x)()
        torch.cuda.synchronize()
        return 0
    from triton.testing import do_bench
    bw = bdc.copy_bandwidth(do_bench)
    print(f"device {torch.cuda.get_device_name()}, triton {triton.__version__}, copy BW "
          f"{bw / 1e12:.2f} TB/s", flush=True)
    results = []
    if args.empty:
        dummy = [torch.empty(1, device="cuda") for _ in range(4)]  # gpu_us wants 4 "inputs"
        for n in (8, 132, 528, 1056, 2112):
            timed(f"empty grid of {n} one-warp programs", 0,
                  lambda _, n=n: empty_launch(n, num_warps=1), dummy, bw, args.rounds, results,
                  check=False)
    for b in [int(v) for v in args.bs.split(",")]:
        bufs = bdc.inputs(b, torch.bfloat16)
        print(f"B={b}: {len(bufs)} rotating inputs", flush=True)
        timed("shipped", b, lambda x: (lambda: dc._launch(x, -1)), bufs, bw, args.rounds, results)
        if args.layouts:
            timed("amax (torch)", b, lambda x: (lambda: x.amax(-1)), bufs, bw, args.rounds,
                  results, check=False)
            dst = torch.empty_like(bufs[0])
            timed("copy (torch, read+write counted as read)", b,
                  lambda x: (lambda: dst.copy_(x)), bufs, bw, args.rounds, results, check=False)
            nsplit, cfg = strided_shipped(b)
            timed(f"strided {nsplit} splits {cfg}", b, split_call(nsplit, cfg, strided=True),
                  bufs, bw, args.rounds, results)
        if args.layouts and b >= 32:
            best = None
            configs = ROW_CONFIGS if args.full_row_sweep else [
                c for c in ROW_CONFIGS if c[2] in (2, 4) and c[3] in (2, 3)]
            for cfg in configs:
                r = timed(f"row {cfg}", b, row_call(cfg), bufs, bw, 1, results)
                if r and (best is None or r["us"] < best["us"]):
                    best = r
            if best:
                print(f"  best row config B={b}: {best['variant']} {best['us']:.2f} us", flush=True)
            for ns, cfg in itertools.product([2, 4], [(2048, 8, 4, 3), (4096, 16, 2, 3),
                                                      (1024, 4, 4, 3)]):
                timed(f"split{ns} {cfg}", b, split_call(ns, cfg), bufs, bw, 1, results)
                timed(f"strided{ns} {cfg}", b, split_call(ns, cfg, strided=True), bufs, bw, 1,
                      results)
        if args.low_pps:
            swept = []
            for (blk, w), u, st, pps in itertools.product(
                    [(256, 1), (512, 2), (1024, 4), (2048, 8)], [4, 8], [2, 3, 4], [1, 2, 3]):
                cfg = dc.Config(block=blk, unroll=u, num_warps=w, programs_per_sm=pps, stages=st)
                r = timed(f"pps {cfg}", b, lambda x, c=cfg: (lambda: dc._launch(x, -1, c)), bufs,
                          bw, 1, results)
                if r:
                    swept.append((r["us"], cfg))
            for _, cfg in sorted(swept, key=lambda t: t[0])[:3]:
                timed(f"pps best {cfg}", b, lambda x, c=cfg: (lambda: dc._launch(x, -1, c)), bufs,
                      bw, args.rounds, results)
        if args.lean:
            swept = []
            for cfg in LEAN_CONFIGS:
                r = timed(f"lean {cfg}", b, lean_call(cfg), bufs, bw, 1, results)
                if r:
                    swept.append((r["us"], cfg))
            for _, cfg in sorted(swept)[:3]:
                timed(f"lean best {cfg}", b, lean_call(cfg), bufs, bw, args.rounds, results)
                timed(f"lean+fma {cfg}", b, lean_call(cfg, fma=True), bufs, bw, args.rounds,
                      results)
            timed("shipped (again)", b, lambda x: (lambda: dc._launch(x, -1)), bufs, bw,
                  args.rounds, results)
        del bufs
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                       "copy_bw": bw, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
