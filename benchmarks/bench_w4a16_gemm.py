"""Benchmark (and tune) the W4A16 GEMM against cuBLAS bf16 and torch fp8 ``_scaled_mm``.

    python benchmarks/bench_w4a16_gemm.py                 # table + JSON (uses the tuned table)
    python benchmarks/bench_w4a16_gemm.py --tune          # sweep configs, write the device's table first
    python benchmarks/bench_w4a16_gemm.py --quality       # also: round-trip error, lm_head agreement

Providers: ``bf16`` (F.linear -> cuBLAS), ``fp8`` (torch._scaled_mm, e4m3 per-tensor scales,
activation already in fp8 -- the most favourable fp8 case; M is padded to 16 where cuBLASLt
requires it), ``ours`` (torch.ops.radiance.w4a16_gemm), ``dequant`` (dequantise + matmul, the
large-M path; drafter shapes only).

Timing, the same for every provider: the calls are captured back to back in one CUDA graph,
each on its own copy of the weights, with at least 256 MiB of weights in the graph (five
times the L2), so every call streams its weights from HBM and no host launch overhead is
counted -- what a decode step under CUDA graphs sees. ``triton.testing.do_bench`` times the
replay (median, L2 flushed before each), divided by the number of calls. The HBM ceiling is
a device-to-device copy measured in the same run (bytes read + written).
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _fp8_epilogue_common import commit  # noqa: E402

from radiance.kernels import w4a16_gemm as wk  # noqa: E402
from radiance.kernels import w4_layout as layout  # noqa: E402
from radiance.w4 import quant  # noqa: E402

SHAPES = {  # name: (N, K)
    "qkv": (3072, 5120),
    "o": (5120, 2048),
    "gate_up": (17408, 5120),
    "down": (5120, 8704),
    "lm_head_151936x2048": (151936, 2048),
    "lm_head_248320x5120": (248320, 5120),
    # per rank at TP=2 (radiance/kernels/shipped.py): Qwen3.5-27B's MTP qkv and o, both int4 heads
    "qkv_7168x5120": (7168, 5120),
    "o_5120x3072": (5120, 3072),
    "lm_head_124160x5120": (124160, 5120),
    "lm_head_75968x2048": (75968, 2048),
}
MS = (1, 8, 16, 32, 64)
GROUP = 128


COLD_BYTES = 256 << 20


def bench(fn, warmup=5, rep=20) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def copies_for(nbytes: int) -> int:
    return max(1, min(64, -(-COLD_BYTES // max(nbytes, 1))))


def bench_graph(calls: list, rep: int = 20) -> float:
    """ms per call: ``calls`` (each reading its own weights) back to back in one CUDA graph."""
    for c in calls:  # compile and warm outside the capture
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    ms = bench(graph.replay, warmup=3, rep=rep)
    del graph
    return ms / len(calls)


def random_packed(n: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random codes and scales: every bit pattern is a valid packed weight, and timing does
    not depend on the values."""
    qshape, sshape = layout.packed_shapes(n, k, GROUP)
    qw = torch.randint(-2**31, 2**31 - 1, qshape, dtype=torch.int32, device=device)
    sc = (torch.rand(sshape, device=device) * 0.01 + 0.001).to(torch.bfloat16)
    return qw, sc


# ---------------------------------------------------------------------------------------
# tuning
# ---------------------------------------------------------------------------------------
def candidates(m: int, n: int, k: int, sms: int) -> list[wk.Config]:
    """The sweep: tiles, split-K and pipeline depth (the variants that never won on the H200 --
    two K blocks per step, the folded code bias, a register cap -- left the kernel; their
    numbers are in docs/benchmarks.md)."""
    bm = wk.block_m_for(m)
    bms = (8, 16) if m <= 8 else (bm,)
    kblocks = layout.padded_k(k) // layout.KBLOCK
    out = []
    for bm in bms:
        for bn, warps in ((64, 4), (128, 4), (128, 8), (256, 8)):
            tiles = -(-n // bn) * -(-m // bm)
            for sk in (1, 2, 4, 8):
                if sk > 1 and (tiles >= 2 * sms or tiles * sk > 8 * sms or kblocks // sk < 2):
                    continue
                for stages in (3, 5):
                    out.append(wk.Config(bn, bm, sk, warps, stages))
    return out


def _warm_one(args):
    """Compile one config in a worker process (fills Triton's on-disk cache)."""
    cfg_d, m, n, k = args
    try:
        import torch as _t
        from radiance.kernels import w4a16_gemm as _wk

        kp = layout.padded_k(k)
        dev = _wk.describe(_t.device("cuda", 0))
        _, grid, kwargs = _wk.launch_plan(m, n, k, GROUP, False, dev, _wk.Config(**cfg_d))
        _wk._w4a16_gemm_kernel.warmup(
            _t.bfloat16, _t.int32, _t.bfloat16, _t.bfloat16, _t.float32, _t.int32,
            m, n, k, k, n, kp * 2, kp // 128,  # stride_qt: 16 rows x Kp/8 words per tile
            grid=grid, **kwargs)
        return None
    except Exception as exc:  # reported, the main process skips what fails to launch
        return f"{cfg_d}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(jobs: list[tuple[dict, int, int, int]], workers: int) -> None:
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        errors = [e for e in pool.imap_unordered(_warm_one, jobs) if e]
    print(f"[tune] precompiled {len(jobs)} variants in {time.time() - t0:.1f} s with {workers} workers"
          f"{'; errors: ' + str(len(errors)) if errors else ''}", flush=True)
    for e in errors[:5]:
        print("   ", e, flush=True)


def tune(shapes: dict, ms: tuple, device, workers: int) -> list[dict]:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    # All benchmarked shapes share one Triton specialisation (every int argument divisible by
    # 16, M and the K-block count are not specialised), so each config compiles once.
    jobs, done = [], set()
    for name, (n, k) in shapes.items():
        for m in ms:
            for cfg in candidates(m, n, k, sms):
                if (cfg, k % 128 == 0) not in done:
                    done.add((cfg, k % 128 == 0))
                    jobs.append((cfg.as_dict(), m, n, k))
    if workers > 1:
        precompile(jobs, workers)
    results = []
    for name, (n, k) in shapes.items():
        qw, sc = random_packed(n, k, device)
        nbytes = qw.numel() * 4 + sc.numel() * 2
        rot = [(qw, sc)] + [(qw.clone(), sc.clone()) for _ in range(copies_for(nbytes) - 1)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            ref = wk.w4a16_gemm_reference(x, qw, sc, GROUP)
            best = None
            t0 = time.time()
            for cfg in candidates(m, n, k, sms):
                try:
                    out = wk.w4a16_gemm_triton(x, qw, sc, GROUP, cfg)
                    if not torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2 * float(ref.float().abs().max())):
                        print(f"[tune] {name} M={m} {cfg}: WRONG RESULT, skipped", flush=True)
                        continue
                    calls = [lambda x=x, q=q, s=s, cfg=cfg: wk.w4a16_gemm_triton(x, q, s, GROUP, cfg) for q, s in rot]
                    us = bench_graph(calls, rep=10) * 1e3
                except Exception as exc:
                    print(f"[tune] {name} M={m} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                if best is None or us < best[0]:
                    best = (us, cfg)
            if best is None:
                continue
            dflt = wk.default_config(m, n, k, sms)
            print(f"[tune] {name:22s} M={m:3d} best {best[0]:8.2f} us {best[1]}  ({time.time() - t0:.1f} s)",
                  flush=True)
            results.append({"name": name, "n": n, "k": k, "group_size": GROUP, "m": m,
                            "config": best[1].as_dict(), "us": round(best[0], 3),
                            "default_config": dflt.as_dict()})
        # after every shape, so a run cut short still leaves what it measured
        write_table(results, device)
        del qw, sc, rot
        torch.cuda.empty_cache()
    return results


def write_table(results: list[dict], device) -> Path:
    import triton

    key = wk.device_key(device)
    path = wk.config_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = {}
    if path.is_file():
        for e in json.loads(path.read_text()).get("configs", []):
            existing[(e["n"], e["k"], e["group_size"], e["m"])] = e
    for r in results:
        existing[(r["n"], r["k"], r["group_size"], r["m"])] = {
            "n": r["n"], "k": r["k"], "group_size": r["group_size"], "m": r["m"],
            "config": r["config"], "us": r["us"]}
    data = {
        "device": torch.cuda.get_device_name(device),
        "key": key,
        "written": datetime.date.today().isoformat(),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "note": "written by benchmarks/bench_w4a16_gemm.py --tune; m = the tuned batch rows, "
                "a batch of M rows uses the entry with the smallest m >= M",
        "configs": sorted(existing.values(), key=lambda e: (e["n"], e["k"], e["group_size"], e["m"])),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    wk.clear_caches()
    return path


# ---------------------------------------------------------------------------------------
# benchmark
# ---------------------------------------------------------------------------------------
def copy_bandwidth(device, gib: float = 2.0) -> float:
    n = int(gib * 2**30) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = bench(lambda src=src, dst=dst: dst.copy_(src), warmup=10, rep=100)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3) / 1e9


def run_bench(shapes: dict, ms: tuple, device, with_dequant: bool) -> list[dict]:
    fp8 = torch.float8_e4m3fn
    one = torch.ones((), dtype=torch.float32, device=device)
    rows = []
    for name, (n, k) in shapes.items():
        w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
        qw, sc = random_packed(n, k, device)
        wbytes = {"bf16": n * k * 2, "fp8": n * k, "ours": qw.numel() * 4 + sc.numel() * sc.element_size()}
        w_rot = [w] + [w.clone() for _ in range(copies_for(wbytes["bf16"]) - 1)]
        w8_rot = [w.to(fp8) for _ in range(copies_for(wbytes["fp8"]))]
        q_rot = [(qw, sc)] + [(qw.clone(), sc.clone()) for _ in range(copies_for(wbytes["ours"]) - 1)]
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            t = {}
            t["bf16"] = bench_graph([lambda x=x, w=w: F.linear(x, w) for w in w_rot])
            fp8_rows = m
            for rows8 in (m, -(-m // 16) * 16):
                x8 = torch.zeros(rows8, k, device=device).to(fp8)
                x8[:m] = x.to(fp8)
                try:
                    t["fp8"] = bench_graph([lambda x8=x8, w8=w8: torch._scaled_mm(
                        x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16) for w8 in w8_rot])
                    fp8_rows = rows8
                    break
                except Exception as exc:
                    print(f"[bench] fp8 {name} M={m} with {rows8} rows: {str(exc)[:150]}", flush=True)
                    t["fp8"] = float("nan")
            t["ours"] = bench_graph([lambda x=x, q=q, s=s: torch.ops.radiance.w4a16_gemm(x, q, s, GROUP)
                                     for q, s in q_rot])
            # one eager call per repetition: adds the host launch path where the GPU waits for it
            t["ours_eager"] = bench(lambda x=x, qw=qw, sc=sc: torch.ops.radiance.w4a16_gemm(x, qw, sc, GROUP))
            if with_dequant and not name.startswith("lm_head"):
                t["dequant"] = bench_graph([lambda x=x, q=q, s=s: wk._dequant_matmul(x, q, s, GROUP)
                                            for q, s in q_rot[:2]])
            io = m * k * 2 + m * n * 2
            row = {"shape": name, "n": n, "k": k, "m": m, "fp8_rows": fp8_rows,
                   "config": wk.lookup_config(m, n, k, GROUP, device).as_dict(),
                   **{f"{p}_us": round(v * 1e3, 3) for p, v in t.items()},
                   "x_vs_bf16": round(t["bf16"] / t["ours"], 3),
                   "x_vs_fp8": round(t["fp8"] / t["ours"], 3),
                   "ours_gbs": round((wbytes["ours"] + io) / (t["ours"] * 1e-3) / 1e9, 1),
                   "bf16_gbs": round((wbytes["bf16"] + io) / (t["bf16"] * 1e-3) / 1e9, 1),
                   "fp8_gbs": round((wbytes["fp8"] + io) / (t["fp8"] * 1e-3) / 1e9, 1)}
            rows.append(row)
            print(f"[bench] {name:22s} M={m:3d} bf16 {row['bf16_us']:9.2f} fp8 {row['fp8_us']:9.2f} "
                  f"ours {row['ours_us']:9.2f} us  x{row['x_vs_bf16']:.2f} vs bf16  x{row['x_vs_fp8']:.2f} vs fp8 "
                  f" {row['ours_gbs']:7.1f} GB/s", flush=True)
        del w, qw, sc, w_rot, w8_rot, q_rot
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------
# quality
# ---------------------------------------------------------------------------------------
def quality(device) -> dict:
    torch.manual_seed(0)
    res = {"roundtrip": [], "lm_head": []}
    n, k = 4096, 5120
    def student_t(df, shape):
        return torch.distributions.StudentT(torch.tensor(float(df), device=device)).sample(shape)

    dists = {
        "gaussian": lambda: torch.randn(n, k, device=device),
        "student_t_df5": lambda: student_t(5, (n, k)),
        "student_t_df3": lambda: student_t(3, (n, k)),
    }
    grids = {"absmax (no clip)": (1.0,), "clip 5 steps 1.0..0.8": (1.0, 0.95, 0.9, 0.85, 0.8),
             "clip 20 steps 1.0..0.525 (default)": quant.SHRINK}
    for dname, make in dists.items():
        w = (make() * 0.02).to(torch.bfloat16)
        row = {"dist": dname}
        for gname, grid in grids.items():
            qw, sc = quant.quantize_pack(w, GROUP, shrink=grid)
            row[gname] = round(quant.roundtrip_error(w, qw, sc, GROUP), 5)
        # per-output-channel fp8 e4m3 for scale
        w32 = w.float()
        s = w32.abs().amax(1, keepdim=True) / 448.0
        deq = (w32 / s).to(torch.float8_e4m3fn).float() * s
        row["fp8 e4m3 per-channel"] = round(float((deq - w32).norm() / w32.norm()), 5)
        res["roundtrip"].append(row)
        print(f"[quality] round trip {dname}: {row}", flush=True)
        del w, w32, deq
    # lm_head: argmax agreement and top-16 overlap against the bf16 head
    v, h = 248320, 5120
    w = (student_t(5, (v, h)) * 0.02).to(torch.bfloat16)
    t0 = time.time()
    qw, sc = quant.quantize_pack(w, GROUP)
    tq = time.time() - t0
    err = quant.roundtrip_error(w, qw, sc, GROUP)
    print(f"[quality] lm_head {v}x{h} quantised in {tq:.2f} s, round trip {err:.4f}", flush=True)
    T = 4096
    for kind in ("random", "peaked"):
        hs = torch.randn(T, h, device=device)
        if kind == "peaked":
            # a confident state: a direction close to one vocabulary row plus noise
            tgt = torch.randint(0, v, (T,), device=device)
            wr = w[tgt].float()
            hs = 3.0 * wr / wr.norm(dim=1, keepdim=True) * (h ** 0.5) + hs
        hs = (hs / hs.norm(dim=1, keepdim=True) * (h ** 0.5)).to(torch.bfloat16)
        agree = overlap = 0.0
        for r0 in range(0, T, 64):
            x = hs[r0:r0 + 64]
            ref = F.linear(x, w).float()
            out = torch.ops.radiance.w4a16_gemm(x, qw, sc, GROUP).float()
            agree += float((ref.argmax(1) == out.argmax(1)).sum())
            a = ref.topk(16, dim=1).indices
            b = out.topk(16, dim=1).indices
            overlap += float((a.unsqueeze(2) == b.unsqueeze(1)).any(2).float().sum()) / 16
        row = {"states": kind, "n_states": T, "argmax_agreement": round(agree / T, 4),
               "top16_overlap": round(overlap / T, 4)}
        res["lm_head"].append(row)
        print(f"[quality] lm_head {kind}: {row}", flush=True)
    res["lm_head_quantise_s"] = round(tq, 2)
    res["lm_head_roundtrip"] = round(err, 5)
    return res


def gpu_run(args, table: dict) -> tuple | None:
    """(device, shapes picked by ``--shapes`` from ``table``, ``--ms``, the report's header) of a
    GPU run, or None (said on stderr) where there is no GPU."""
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return None
    import triton

    device = torch.device("cuda", 0)
    shapes = {s: table[s] for s in args.shapes.split(",") if s}
    ms = tuple(int(v) for v in args.ms.split(","))
    report = {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(device),
              "commit": commit(), "torch": torch.__version__, "triton": triton.__version__}
    return device, shapes, ms, report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tune", action="store_true", help="sweep configs and write the device's table")
    p.add_argument("--tune-only", action="store_true", help="tune, write the table, do not benchmark")
    p.add_argument("--quality", action="store_true", help="also measure quantisation quality")
    p.add_argument("--no-bench", action="store_true")
    p.add_argument("--profile-once", metavar="SHAPE", default=None,
                   help="run the kernel for SHAPE at the first --ms value twice (for ncu) and exit")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--ms", default=",".join(map(str, MS)))
    p.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    p.add_argument("--json", default=str(REPO / "reports" / "bench_w4a16_gemm.json"))
    args = p.parse_args(argv)
    run = gpu_run(args, SHAPES)
    if run is None:
        return 1
    device, shapes, ms, report = run
    print(f"[bench] {report}", flush=True)
    if args.profile_once:
        n, k = SHAPES[args.profile_once]
        qw, sc = random_packed(n, k, device)
        x = torch.randn(ms[0], k, dtype=torch.bfloat16, device=device)
        for _ in range(2):
            torch.ops.radiance.w4a16_gemm(x, qw, sc, GROUP)
        torch.cuda.synchronize()
        print(f"[profile] {args.profile_once} M={ms[0]} {wk.lookup_config(ms[0], n, k, GROUP, device)}", flush=True)
        return 0
    if args.tune or args.tune_only:
        results = tune(shapes, ms, device, args.workers)
        path = write_table(results, device)
        report["tuned"] = results
        print(f"[tune] wrote {path}", flush=True)
    if not args.tune_only and not args.no_bench:
        report["copy_gbs"] = round(copy_bandwidth(device), 1)
        print(f"[bench] device-to-device copy: {report['copy_gbs']} GB/s (read + write)", flush=True)
        report["rows"] = run_bench(shapes, ms, device, with_dequant=True)
        print()
        print(f"{'shape':20s} {'M':>3s} {'bf16 us':>8s} {'fp8 us':>8s} {'ours us':>8s} {'eager':>7s} "
              f"{'vs bf16':>7s} {'vs fp8':>6s} {'GB/s':>6s} {'%copy':>5s} config")
        for r in report["rows"]:
            c = r["config"]
            print(f"{r['shape'][:20]:20s} {r['m']:3d} {r['bf16_us']:8.2f} {r['fp8_us']:8.2f} {r['ours_us']:8.2f} "
                  f"{r['ours_eager_us']:7.1f} {r['x_vs_bf16']:7.2f} {r['x_vs_fp8']:6.2f} {r['ours_gbs']:6.0f} "
                  f"{100 * r['ours_gbs'] / report['copy_gbs']:5.1f} "
                  f"{c['block_n']}/{c['block_m']}/sk{c['split_k']}/w{c['num_warps']}/s{c['num_stages']}")
    if args.quality:
        report["quality"] = quality(device)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"[bench] wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
