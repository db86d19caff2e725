"""Benchmark the fused add + RMSNorm + fp8 quant epilogue against what it replaces.

    python benchmarks/bench_add_rms_quant.py [--json OUT.json] [--ms 8,16,32,64] [--ks 2048,5120]
        [--modes graph,eager,host] [--groups 0,128] [--sweep] [--host-breakdown]

Providers (bf16 activations, e4m3fn, M decode-sized; per token, and per group of 128 where
``--groups`` has 128):
  floor          one empty Triton kernel: the single-launch floor, measured in the same run
  eager          stock chain in eager PyTorch: vLLM 0.32.0 GemmaRMSNorm.forward_native's
                 arithmetic (fused_add_rms_norm native) + QuantFP8.forward_native
  compile_stock  torch.compile(M dynamic) of that stock chain (what vLLM's inductor does)
  compile_reference  torch.compile(M dynamic) of add_rms_quant_reference (the bit-exact
                 PyTorch reference; the baseline the issue names)
  ours           add_rms_quant_triton (one launch, cached per-shape plan)
  ours_op        torch.ops.radiance.add_rms_quant (Library-registered op, what callers use)
  ours_custom_op the same kernel behind a torch.library.custom_op (the previous registration)
Timing modes: ``graph`` = CUDA-graph replay (do_bench_cudagraph; the decode setting, device
time only), ``eager`` = triton.testing.do_bench (events around each call after an L2 flush: the
flush hides host time shorter than itself), ``host`` = events around 200 back-to-back calls,
per call (what a caller sees when the host is the bottleneck: launch path included).
``kernels``: GPU kernels per call (profiler). ``--sweep``: graph-mode time of ours at M=8 for
several num_warps per K (bit-exactness checked for each). ``--host-breakdown``: host µs per call
of each piece of the launch path (empty launch, allocations, the launch alone, the function,
the public entry -- which goes past the dispatcher in eager mode -- and the op).
"""
from __future__ import annotations

import torch
from _fp8_epilogue_common import (
    FMAX,
    FP8,
    bench_args,
    compile_m_dynamic,
    count_kernels,
    empty_launch,
    mark_m_dynamic,
    print_table,
    stock_per_token_quant,
    time_us,
    write_json,
)

from radiance.kernels import add_rms_quant as arq
from radiance.kernels import fp8_common as fc

EPS = 1e-6
SWEEP_WARPS = {2048: (2, 8, 16), 5120: (4, 16, 32)}  # num_warps tried by --sweep (defaults 4 and 8 are in the main table)


def stock_group_quant(x: torch.Tensor, group: int = 128):
    """QuantFP8.forward_native per group (the block-fp8 checkpoints' activation quant)."""
    m, k = x.shape
    xg = x.view(m, k // group, group).to(torch.float32)
    scale = (xg.abs().amax(dim=-1, keepdim=True) / FMAX).clamp(min=1.0 / (FMAX * 512.0))
    q = (xg * scale.reciprocal()).clamp(-FMAX, FMAX).to(FP8)
    return q.view(m, k), scale.view(m, k // group)


def stock_chain(y, r, w, eps=EPS, group=0):
    x = y.to(torch.float32) + r.to(torch.float32)
    new_r = x.to(y.dtype)
    var = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    normed = (x * (w.float() + 1.0)).to(y.dtype)
    q, scale = stock_group_quant(normed, group) if group else stock_per_token_quant(normed)
    return q, scale, new_r


@torch.library.custom_op("radiance_bench::add_rms_quant_custom_op", mutates_args=())
def _custom_op(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
               group_size: int, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return arq.add_rms_quant_triton(y, residual, weight, eps, group_size, fp8_dtype)


def host_us(fn, n: int = 200, reps: int = 7) -> float:
    """Median over reps of (events around n back-to-back calls) / n."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        times.append(1000.0 * start.elapsed_time(end) / n)
    return sorted(times)[len(times) // 2]


def timed(fn, mode: str) -> float:
    return host_us(fn) if mode == "host" else time_us(fn, mode)


def same(a, b) -> bool:
    return (torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
            and torch.equal(a[2], b[2]))


def sweep(ks, modes) -> list[dict]:
    """ours at M=8 with other num_warps (fresh plans), checked against the reference."""
    rows = []
    for k in ks:
        block = sum(fc.split_row(k))
        for warps in SWEEP_WARPS.get(k, ()):
            arq.WARPS_OVERRIDE[block] = warps
            arq._PLANS.clear()
            y, r, w = inputs(8, k, seed=7)
            for group in (0, 128):
                got = arq.add_rms_quant_triton(y, r, w, EPS, group, FP8)
                want = arq.add_rms_quant_reference(y.cpu(), r.cpu(), w.cpu(), EPS, group, FP8)
                ok = same(tuple(t.cpu() for t in got), want)
                row = {"M": 8, "K": k, "group": group, "num_warps": warps, "bit_exact": ok}
                for mode in modes:
                    row[f"{mode}_us"] = timed(
                        lambda y=y, r=r, w=w, g=group: arq.add_rms_quant_triton(y, r, w, EPS, g, FP8), mode)
                rows.append(row)
                print(row, flush=True)
        arq.WARPS_OVERRIDE.pop(block, None)
        arq._PLANS.clear()
    return rows


def host_breakdown(ks, n: int = 2000) -> list[dict]:
    """Host microseconds per call of each piece of the launch path (perf_counter over n calls,
    GPU not waited for): where a caller's time goes when the host is the bottleneck."""
    import time
    rows = []
    floor = empty_launch()
    for k in ks:
        y, r, w = inputs(8, k)
        arq._PLANS.clear()
        got = arq.add_rms_quant_triton(y, r, w, EPS, 0, FP8)
        plan = next(iter(arq._PLANS.values()))
        q, scale, new_r = (torch.empty_like(t) for t in got)
        pieces = {
            "empty Triton launch": floor,
            "torch.empty x1": lambda: torch.empty((8, k), dtype=FP8, device="cuda"),
            "torch.empty x3": lambda: (torch.empty((8, k), dtype=FP8, device="cuda"),
                                       torch.empty((8, 1), dtype=torch.float32, device="cuda"),
                                       torch.empty((8, k), dtype=torch.bfloat16, device="cuda")),
            "plan.launch (outputs given)": lambda: plan.launch(8, y, r, w, q, scale, new_r, EPS),
            "add_rms_quant_triton": lambda: arq.add_rms_quant_triton(y, r, w, EPS, 0, FP8),
            "add_rms_quant (public entry)": lambda: arq.add_rms_quant(y, r, w, EPS, 0, FP8),
            "torch.ops.radiance.add_rms_quant": lambda: torch.ops.radiance.add_rms_quant(y, r, w, EPS, 0, FP8),
        }
        for name, fn in pieces.items():
            fn()
            torch.cuda.synchronize()
            best = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                best.append((time.perf_counter() - t0) / n * 1e6)
                torch.cuda.synchronize()
            row = {"K": k, "piece": name, "host_us": sorted(best)[len(best) // 2]}
            rows.append(row)
            print(row, flush=True)
    return rows


def inputs(m, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    y = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    r = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g) * 4
    w = torch.randn(k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.1
    return y, r, w


def main(argv=None) -> int:
    args = bench_args(__doc__, argv, modes="graph,eager,host", flags=("sweep", "host-breakdown"),
                      ms="8,16,32,64", ks="2048,5120", groups="0,128")
    ms, ks, groups, modes = args.ms, args.ks, args.groups, args.modes

    sweep_rows = sweep(ks, ["graph"]) if args.sweep else []
    host_rows = host_breakdown(ks) if args.host_breakdown else []

    floor = empty_launch()
    rows = []
    for group in groups:
        compiled_stock = compile_m_dynamic(lambda y, r, w, g=group: stock_chain(y, r, w, EPS, g))
        compiled_ref = compile_m_dynamic(
            lambda y, r, w, g=group: arq.add_rms_quant_reference(y, r, w, EPS, g, FP8))
        for k in ks:
            for m in ms:
                y, r, w = inputs(m, k)
                mark_m_dynamic(y, r)
                a = (y, r, w, EPS, group, FP8)
                providers = {
                    "floor": floor,
                    "eager": lambda a=a: stock_chain(*a[:5]),
                    "compile_stock": lambda a=a, c=compiled_stock: c(*a[:3]),
                    "compile_reference": lambda a=a, c=compiled_ref: c(*a[:3]),
                    "ours": lambda a=a: arq.add_rms_quant_triton(*a),
                    "ours_op": lambda a=a: torch.ops.radiance.add_rms_quant(*a),
                    "ours_custom_op": lambda a=a: torch.ops.radiance_bench.add_rms_quant_custom_op(*a),
                }
                for name, fn in providers.items():
                    arq._PLANS.clear()
                    row = {"M": m, "K": k, "group": group, "provider": name}
                    try:
                        for mode in modes:
                            row[f"{mode}_us"] = timed(fn, mode)
                    except Exception as exc:  # e.g. the compiler refusing the reference
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                        rows.append(row)
                        print(row, flush=True)
                        continue
                    try:
                        row["kernels"] = count_kernels(fn)
                    except RuntimeError as exc:  # profiler unavailable
                        row["kernels"], row["kernels_error"] = None, type(exc).__name__
                    rows.append(row)
                arq._PLANS.clear()
                by = {r_["provider"]: r_ for r_ in rows[-len(providers):]}
                for mode in modes:
                    for who in ("ours", "ours_op"):
                        t = by[who][f"{mode}_us"]
                        for base in ("compile_stock", "compile_reference"):
                            if by[base].get(f"{mode}_us") is not None:
                                by[who][f"{mode}_vs_{base}"] = by[base][f"{mode}_us"] / t
                        by[who][f"{mode}_vs_floor"] = t / by["floor"][f"{mode}_us"]
                print_table(rows[-len(providers):], ["M", "K", "group", "provider", "kernels"]
                            + [f"{m_}_us" for m_ in modes]
                            + [f"{m_}_vs_{s}" for m_ in modes for s in ("compile_stock", "compile_reference", "floor")])
    # Launches per decoder layer: Qwen3-Next has two norm sites per layer (input_layernorm,
    # post_attention_layernorm), each followed by the quant of the linear it feeds.
    per_site = {r_["provider"]: r_["kernels"] for r_ in rows if r_["M"] == ms[0] and r_["K"] == ks[0]
                and r_["group"] == groups[0]}
    layer = {name: (2 * n if n is not None else None) for name, n in per_site.items()
             if name in ("eager", "compile_stock", "ours")}
    print("# norm+quant launches per decoder layer (2 sites):", layer)
    print("\n# all rows")
    print_table(rows, ["M", "K", "group", "provider", "kernels"] + [f"{m_}_us" for m_ in modes]
                + [f"{m_}_vs_{s}" for m_ in modes for s in ("compile_stock", "compile_reference", "floor")])
    write_json(args.json, "add_rms_quant", rows,
               {"note": "bf16, e4m3fn; *_vs_compile_stock: speed-up over torch.compile of the stock "
                        "chain; *_vs_floor: time / empty launch", "sweep": sweep_rows,
                "launches_per_decoder_layer": layer, "host_breakdown": host_rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
