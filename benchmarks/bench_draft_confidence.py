"""Benchmark: per-row (max, sum-exp, argmax) over a [B, V] logits block (draft confidence capture).

Providers:
  stock      softmax in fp32, then max (what a confidence gate costs without a kernel)
  reference  radiance's PyTorch reference (several torch ops)
  compile    torch.compile of the reference (skipped with --no-compile)
  op         torch.ops.radiance.draft_confidence (the registered op: dispatcher + launcher + kernel)
  ours       radiance.kernels.draft_confidence.draft_confidence, the public entry (eager CUDA
             tensors skip the op's dispatch and go to the launcher)
  direct     draft_confidence_triton (the launcher itself)

Four times per provider (µs per call):
  event  one call between CUDA events after an L2 flush (``do_bench``). The flush kernel keeps
         the GPU busy while the host enqueues the call, so this hides most host time: it is the
         GPU-side time of one launch, launch latency included.
  call   one call between CUDA events on an idle GPU, inputs rotating (cold L2): the host's
         launch path is on the clock (what a caller waiting on the result sees).
  host   wall time per call of 2000 back-to-back calls: the host's cost per call where the
         host is slower than the GPU, else the GPU's.
  gpu    device time per call from CUDA-graph replays over rotating inputs larger than L2 (no
         host overhead, cold HBM reads): the basis of the bandwidth figures.
Device-to-device copy bandwidth (bytes read + written) is measured in the same run as the
ceiling. ``--tune`` sweeps block, unroll, warps and programs per SM per batch size (gpu time),
re-times the best few, and writes the per-device table the launcher reads
(``radiance/configs/draft_confidence/<device>.json``; ``--table`` writes a copy elsewhere too).

    python benchmarks/bench_draft_confidence.py [--json out.json] [--tune [--table t.json]] [--quick]
        [--vocab 124160,75968] [--tune-b 1,8,16] [--narrow]

``--vocab``: the columns to tune and benchmark (default 248320); the table keeps one set of
entries per column count (``cols``), and a launch takes the set nearest its own.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radiance.kernels import draft_confidence as dc  # noqa: E402

V = 248320  # the default columns; --vocab sets others
SPEC_BW = 4.8e12  # H200 datasheet HBM3e bandwidth, bytes/s
L2_BYTES = 60 << 20  # H200; inputs rotate through at least twice this much
TUNE_B = (1, 8, 16, 32, 64, 128)
# One-warp programs (256 lanes) reduce with shuffles only, no shared memory or CTA barrier: on the
# H200 they beat 4-warp programs by 0.4 us at B=8 and 0.8 us at B=64 (docs/benchmarks.md).
TUNE_SPACE = {"block_warps": [(256, 1), (512, 2), (1024, 4), (2048, 8)], "unroll": [1, 2, 4, 8],
              "stages": [1, 2, 3, 4], "programs_per_sm": [4, 8, 12, 16, 24]}
# --narrow: the part of TUNE_SPACE every winner so far came from (one- and two-warp programs,
# pipelined loops), for a tune that must fit a short device lease
NARROW_SPACE = {"block_warps": [(256, 1), (512, 2)], "unroll": [1, 2, 4, 8], "stages": [2, 3, 4],
                "programs_per_sm": [4, 8, 12, 16, 24]}


def copy_bandwidth(do_bench) -> float:
    """Bytes/s of a large device copy, counting read + write (the HBM ceiling we compare to)."""
    n = 1 << 28  # 1 GiB of fp32
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * n / (ms * 1e-3)


def stock(x):
    return torch.softmax(x, dim=-1, dtype=torch.float32).max(dim=-1)


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


def call_us(fn, bufs, reps=300) -> float:
    """Median of single calls between events on an idle GPU (host launch path on the clock)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(reps + 20):
        x = bufs[i % len(bufs)]
        torch.cuda.synchronize()
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        if i >= 20:
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def host_us(fn, x, n=2000) -> float:
    for _ in range(50):
        fn(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / n


def inputs(b, dtype, cols=None):
    cols = cols or V
    one = b * cols * torch.tensor([], dtype=dtype).element_size()
    n = max(2, min(16, -(-2 * L2_BYTES // one)))
    return [(torch.randn(b, cols, device="cuda") * 4).to(dtype) for _ in range(n)]


def check(got, want):
    assert torch.equal(got[2], want[2]) and torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=3e-5, atol=0)


def tune(bw: float, table_copy: str | None, dev: str, cols_list=(V,), tune_b=TUNE_B,
         space=TUNE_SPACE) -> list[dict]:
    """Sweep configs per (columns, batch size) (gpu time); re-time the best 3 of each; merge the
    winners into the table (entries of other columns are kept)."""
    tuned = []
    best = {}
    configs = [dc.Config(block, unroll, warps, pps, stages)
               for (block, warps), unroll, stages, pps in itertools.product(
                   space["block_warps"], space["unroll"], space["stages"],
                   space["programs_per_sm"])]
    for cols, b in itertools.product(cols_list, tune_b):
        bufs = inputs(b, torch.bfloat16, cols)
        want = dc.draft_confidence_reference(bufs[0], -1)
        nbytes = bufs[0].numel() * bufs[0].element_size()
        rows = []
        for cfg in configs:
            try:
                got = dc._launch(bufs[0], -1, cfg)
                ok = torch.equal(got[2], want[2]) and torch.equal(got[0], want[0])
                us = gpu_us(lambda buf: (lambda: dc._launch(buf, -1, cfg)), bufs, reps=20)
            except Exception as exc:  # a config that does not compile here is reported
                print(f"  B={b} {cfg}: {type(exc).__name__}: {exc}")
                continue
            rows.append({"B": b, "V": cols, **cfg.as_dict(), "ok": ok, "us_gpu": us})
        top = sorted((r for r in rows if r["ok"]), key=lambda r: r["us_gpu"])[:3]
        for r in top:  # the sweep's single short timing is noisy at the top: time again, longer
            cfg = dc.Config(r["block"], r["unroll"], r["num_warps"], r["programs_per_sm"],
                            r["stages"])
            r["us_gpu_retimed"] = min(
                gpu_us(lambda buf: (lambda: dc._launch(buf, -1, cfg)), bufs, reps=100)
                for _ in range(3))
        if top:
            win = min(top, key=lambda r: r["us_gpu_retimed"])
            best[(cols, b)] = win
            print(f"  tune V={cols} B={b:3d}: {win['block']}/{win['unroll']}/{win['num_warps']}w/"
                  f"{win['programs_per_sm']}pps/S{win['stages']} {win['us_gpu_retimed']:.2f} us "
                  f"({100 * nbytes / (win['us_gpu_retimed'] * 1e-6) / bw:.1f}% copy BW)")
        for r in rows:
            r["frac_copy_bw_gpu"] = nbytes / (r["us_gpu"] * 1e-6) / bw
        tuned += rows
        del bufs
    key = dc.device_key(torch.device("cuda"))
    path = dc.CONFIG_DIR / f"{key}.json"
    entries = {}
    if path.is_file():
        for e in json.loads(path.read_text()).get("configs", []):
            entries[(int(e.get("cols", dc.TABLE_COLS)), int(e["rows"]))] = e
    for (cols, b), r in best.items():
        entries[(cols, b)] = {"cols": cols, "rows": b,
                              "config": dc.Config(r["block"], r["unroll"], r["num_warps"],
                                                  r["programs_per_sm"], r["stages"]).as_dict(),
                              "us": round(r["us_gpu_retimed"], 3)}
    for (cols, _), e in entries.items():
        e.setdefault("cols", cols)
    table = {"device": dev, "key": key, "written": time.strftime("%Y-%m-%d"),
             "triton": __import__("triton").__version__, "torch": torch.__version__,
             "note": "written by benchmarks/bench_draft_confidence.py --tune (bf16, gpu time); a "
                     "[B, V] block uses, among the entries of the cols nearest V, the one with the "
                     "smallest rows >= B",
             "configs": [{"cols": e["cols"], "rows": e["rows"], "config": e["config"], "us": e["us"]}
                         for _, e in sorted(entries.items())]}
    dc.CONFIG_DIR.mkdir(parents=True, exist_ok=True)
    for path in [dc.CONFIG_DIR / f"{key}.json"] + ([table_copy] if table_copy else []):
        with open(path, "w") as f:
            json.dump(table, f, indent=1)
    dc.load_table.cache_clear()
    dc._LAUNCHES.clear()
    return tuned


def host_breakdown() -> dict:
    """Host µs per call of the pieces of the launch path (B=1: the GPU is never the limit)."""
    x = inputs(1, torch.bfloat16)[0]
    dev = x.device
    dc.draft_confidence_triton(x, -1)
    outs = (torch.empty(1, dtype=torch.float32, device=dev),)
    f32, i64 = torch.float32, torch.int64
    pieces = {
        "torch.empty x1": lambda _: torch.empty(1, dtype=f32, device=dev),
        "torch.empty x3": lambda _: (torch.empty(1, dtype=f32, device=dev),
                                     torch.empty(1, dtype=f32, device=dev),
                                     torch.empty(1, dtype=i64, device=dev)),
        "empty [2,B] + unbind + empty": lambda _: (torch.empty(2, 1, dtype=f32, device=dev).unbind(0),
                                                   torch.empty(1, dtype=i64, device=dev)),
        "data_ptr x4": lambda _: (x.data_ptr(), x.data_ptr(), x.data_ptr(), x.data_ptr()),
        "raw stream + device": lambda _: (torch._C._cuda_getCurrentRawStream(dev.index),
                                          torch._C._cuda_getDevice()),
        "zero_ (a torch launch)": lambda _: outs[0].zero_(),
        "draft_confidence_triton": lambda t: dc.draft_confidence_triton(t, -1),
        "draft_confidence (entry)": lambda t: dc.draft_confidence(t, -1),
        "torch.ops op": lambda t: torch.ops.radiance.draft_confidence(t, -1),
    }
    out = {}
    for name, fn in pieces.items():
        try:
            out[name] = min(host_us(fn, x, n=3000) for _ in range(3))
        except Exception as exc:
            print(f"  host piece {name} failed: {type(exc).__name__}: {exc}")
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        dc.draft_confidence(x, -1)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
    print(text.getvalue()[-3000:])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--tune", action="store_true", help="sweep kernel configs, write the table")
    p.add_argument("--table", default=None, help="with --tune: also write the table here")
    p.add_argument("--quick", action="store_true", help="fewer shapes and providers")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    p.add_argument("--vocab", default=str(V), help="comma list of columns to tune and benchmark")
    p.add_argument("--tune-b", default=",".join(map(str, TUNE_B)), help="batch sizes to tune")
    p.add_argument("--batches", default=None, help="batch sizes to benchmark (default: by --quick)")
    p.add_argument("--narrow", action="store_true", help="tune over NARROW_SPACE")
    p.add_argument("--no-host", action="store_true", help="skip the host-time breakdown")
    args = p.parse_args(argv)
    vocab = [int(v) for v in args.vocab.split(",") if v]
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
    launch_call_us = call_us(lambda _: empty.zero_(), [empty])
    launch_host_us = host_us(lambda _: empty.zero_(), empty)
    print(f"one small launch (zero_ of 1 element): event {launch_us:.2f} us, call "
          f"{launch_call_us:.2f} us, host {launch_host_us:.2f} us")

    try:
        breakdown = {} if args.no_host else host_breakdown()
    except Exception:  # diagnostics only: the tables below matter more
        import traceback
        traceback.print_exc()
        breakdown = {}
    print("host us per call, by piece (B=1, back-to-back):")
    for name, us in breakdown.items():
        print(f"  {name:40s} {us:7.2f}")

    tuned = []
    if args.tune:
        try:
            tuned = tune(bw, args.table, dev, vocab, [int(b) for b in args.tune_b.split(",")],
                         NARROW_SPACE if args.narrow else TUNE_SPACE)
        except Exception:  # the untuned table below is still worth measuring
            import traceback
            traceback.print_exc()
    table = {f"V={cols} B={b}": cfg.as_dict()
             for cols, entries in dc.load_table(dc.device_key(torch.device("cuda"))).items()
             for b, cfg in entries}

    batches = [8, 64] if args.quick else [1, 8, 16, 64, 128]
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float32]
    providers = {"stock": stock, "reference": lambda x: dc.draft_confidence_reference(x, -1),
                 "op": lambda x: torch.ops.radiance.draft_confidence(x, -1),
                 "ours": lambda x: dc.draft_confidence(x, -1),
                 "direct": lambda x: dc.draft_confidence_triton(x, -1)}
    if not args.no_compile and not args.quick:
        providers["compile"] = torch.compile(lambda x: dc.draft_confidence_reference(x, -1))
    timed_call = {"stock", "op", "ours", "direct"}
    timed_gpu = {"stock", "ours"}

    rows = []
    for cols, dtype, b in itertools.product(vocab, dtypes, batches):
        bufs = inputs(b, dtype, cols)
        x = bufs[0]
        nbytes = x.numel() * x.element_size()
        want = dc.draft_confidence_reference(x, -1)  # correctness on this very input first
        for name in ("op", "ours", "direct"):
            check(providers[name](x), want)
        for name, fn in providers.items():
            try:
                ms = do_bench(lambda: fn(x), warmup=25, rep=100, return_mode="median")
                c_us = call_us(fn, bufs) if name in timed_call else float("nan")
                h_us = host_us(fn, x) if name in timed_call else float("nan")
                dev_us = gpu_us(lambda buf: (lambda: fn(buf)), bufs) \
                    if name in timed_gpu else float("nan")
            except Exception as exc:  # a provider that cannot run here is reported, not fatal
                print(f"  {name} failed: {type(exc).__name__}: {exc}")
                continue
            rows.append({"provider": name, "dtype": str(dtype).replace("torch.", ""), "B": b,
                         "V": cols, "bytes": nbytes, "us_event": ms * 1e3, "us_call": c_us,
                         "us_host": h_us, "us_gpu": dev_us,
                         "GBps_gpu": nbytes / (dev_us * 1e-6) / 1e9,
                         "frac_copy_bw_gpu": nbytes / (dev_us * 1e-6) / bw,
                         "frac_spec_bw_gpu": nbytes / (dev_us * 1e-6) / SPEC_BW})
        del bufs

    print(f"\n{'provider':10s} {'dtype':9s} {'V':>7s} {'B':>4s} {'event':>8s} {'call':>8s} {'host':>8s} "
          f"{'gpu':>8s} {'%copyBW':>8s} {'%spec':>6s}   (us per call)")
    for r in rows:
        print(f"{r['provider']:10s} {r['dtype']:9s} {r['V']:7d} {r['B']:4d} {r['us_event']:8.2f} "
              f"{r['us_call']:8.2f} {r['us_host']:8.2f} {r['us_gpu']:8.2f} "
              f"{100 * r['frac_copy_bw_gpu']:7.1f}% {100 * r['frac_spec_bw_gpu']:5.1f}%")
    if tuned:
        print(f"\ntuned table: {table}")
        print(f"configs with wrong results: {sum(not t['ok'] for t in tuned)} of {len(tuned)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "draft_confidence", "device": dev, "date": time.strftime("%Y-%m-%d"),
                       "commit": commit, "triton": triton.__version__, "torch": torch.__version__,
                       "copy_bw_Bps": bw, "launch_us": launch_us, "launch_call_us": launch_call_us,
                       "launch_host_us": launch_host_us, "default_config": dc.DEFAULT_CONFIG.as_dict(),
                       "table": table, "host_breakdown": breakdown, "rows": rows, "tune": tuned},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
