"""Benchmark: per-row (max, sum-exp, argmax) over a [B, V] logits block (draft confidence capture).

Providers:
  stock      softmax in fp32, then max (what a confidence gate costs without a kernel)
  reference  radiance's PyTorch reference (several torch ops)
  compile    torch.compile of the reference
  ours       the Triton split-reduction kernel (one launch)

Two times per provider: "event" is one call timed with CUDA events after an L2 flush (what a
caller sees, launch latency included when the host is the bottleneck); "gpu" is device time
from CUDA-graph replays of calls over rotating inputs larger than L2 (no host overhead, cold
HBM reads), the basis of the bandwidth figures. Device-to-device copy bandwidth (bytes read +
written) is measured in the same run as the ceiling. ``--tune`` sweeps the reduction scheme,
block size, warps and programs per SM (device time).

    python benchmarks/bench_draft_confidence.py [--json out.json] [--tune] [--quick]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radiance.kernels import draft_confidence as dc  # noqa: E402

V = 248320


def copy_bandwidth(do_bench) -> float:
    """Bytes/s of a large device copy, counting read + write (the HBM ceiling we compare to)."""
    n = 1 << 28  # 1 GiB of fp32
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3)


def stock(x):
    return torch.softmax(x, dim=-1, dtype=torch.float32).max(dim=-1)


L2_BYTES = 60 << 20  # H200; inputs rotate through at least twice this much


def gpu_us(make_call, bufs, reps=50) -> float:
    """Device time per call with no host overhead and a cold L2: one CUDA graph holding one
    call per input buffer (together well past L2), replayed; per-call average."""
    calls = [make_call(b) for b in bufs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / len(calls)


def inputs(b, dtype):
    one = b * V * torch.tensor([], dtype=dtype).element_size()
    n = max(2, min(16, -(-2 * L2_BYTES // one)))
    return [(torch.randn(b, V, device="cuda") * 4).to(dtype) for _ in range(n)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--tune", action="store_true", help="sweep kernel configs")
    p.add_argument("--quick", action="store_true", help="fewer shapes and providers")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA or ROCm GPU", file=sys.stderr)
        return 2
    import triton
    from triton.testing import do_bench

    dev = torch.cuda.get_device_name()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "uncommitted"
    except OSError:
        commit = "unknown"
    bw = copy_bandwidth(do_bench)
    print(f"device: {dev}; triton {triton.__version__}; torch {torch.__version__}")
    print(f"copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")

    # an empty launch: what one kernel launch costs here, the floor at small B
    empty = torch.empty(1, device="cuda")
    launch_us = do_bench(lambda: empty.zero_(), warmup=25, rep=200, return_mode="median") * 1e3
    print(f"one small launch (zero_ of 1 element), event-timed: {launch_us:.2f} us")

    batches = [8, 64] if args.quick else [1, 8, 16, 64, 128]
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float32]
    providers = {"stock": stock, "reference": lambda x: dc.draft_confidence_reference(x, -1),
                 "ours": lambda x: dc.draft_confidence_triton(x, -1)}
    if not args.no_compile and not args.quick:
        providers["compile"] = torch.compile(lambda x: dc.draft_confidence_reference(x, -1))

    rows = []
    for dtype, b in itertools.product(dtypes, batches):
        bufs = inputs(b, dtype)
        x = bufs[0]
        nbytes = x.numel() * x.element_size()
        # correctness on this very input before timing
        want = dc.draft_confidence_reference(x, -1)
        got = dc.draft_confidence_triton(x, -1)
        assert torch.equal(got[2], want[2]) and torch.equal(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=3e-5, atol=0)
        for name, fn in providers.items():
            try:
                # event-timed single call, L2 flushed: includes launch latency when the host
                # is the bottleneck
                ms = do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
                dev_us = gpu_us(lambda buf: (lambda: fn(buf)), bufs) \
                    if name in ("ours", "stock") else float("nan")
            except Exception as exc:  # a provider that cannot run here is reported, not fatal
                print(f"  {name} failed: {type(exc).__name__}: {exc}")
                continue
            rows.append({"provider": name, "dtype": str(dtype).replace("torch.", ""), "B": b,
                         "V": V, "us_event": ms * 1e3, "us_gpu": dev_us,
                         "GBps_gpu": nbytes / (dev_us * 1e-6) / 1e9,
                         "frac_copy_bw_gpu": nbytes / (dev_us * 1e-6) / bw})
        del bufs

    tuned = []
    if args.tune:
        for b in (8, 64):
            bufs = inputs(b, torch.bfloat16)
            x = bufs[0]
            want = dc.draft_confidence_reference(x, -1)
            nbytes = x.numel() * x.element_size()
            for two, block, warps, pps in itertools.product([True, False], [2048, 4096, 8192],
                                                            [4, 8], [2, 4, 8]):
                cfg = (block, warps, pps, two)
                got = dc._launch(x, -1, *cfg)
                ok = torch.equal(got[2], want[2]) and torch.equal(got[0], want[0])
                us = gpu_us(lambda buf: (lambda: dc._launch(buf, -1, *cfg)), bufs, reps=20)
                tuned.append({"dtype": "bfloat16", "B": b, "block": block, "warps": warps,
                              "programs_per_sm": pps, "two_pass": two, "ok": ok, "us_gpu": us,
                              "frac_copy_bw_gpu": nbytes / (us * 1e-6) / bw})
            del bufs

    print(f"\n{'provider':10s} {'dtype':9s} {'B':>4s} {'us(event)':>10s} {'us(gpu)':>9s} "
          f"{'GB/s':>8s} {'%copyBW':>8s}")
    for r in rows:
        print(f"{r['provider']:10s} {r['dtype']:9s} {r['B']:4d} {r['us_event']:10.2f} "
              f"{r['us_gpu']:9.2f} {r['GBps_gpu']:8.0f} {100 * r['frac_copy_bw_gpu']:7.1f}%")
    if tuned:
        print("\ntuning (bf16, device time): best per B and reduction")
        for b, two in itertools.product(sorted({t["B"] for t in tuned}), [True, False]):
            best = sorted((t for t in tuned if t["B"] == b and t["two_pass"] == two and t["ok"]),
                          key=lambda t: t["us_gpu"])[:2]
            for t in best:
                print(f"  B={b:3d} {'2pass ' if two else 'online'} block={t['block']:5d} "
                      f"warps={t['warps']} pps={t['programs_per_sm']} {t['us_gpu']:.2f} us "
                      f"{100 * t['frac_copy_bw_gpu']:.1f}% copy BW")
        bad = [t for t in tuned if not t["ok"]]
        print(f"  configs with wrong results: {len(bad)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "draft_confidence", "device": dev, "date": time.strftime("%Y-%m-%d"),
                       "commit": commit, "triton": triton.__version__, "torch": torch.__version__,
                       "copy_bw_Bps": bw, "launch_us": launch_us,
                       "config": {"block": dc.BLOCK, "warps": dc.NUM_WARPS,
                                  "programs_per_sm": dc.PROGRAMS_PER_SM, "two_pass": dc.TWO_PASS},
                       "rows": rows, "tune": tuned}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
