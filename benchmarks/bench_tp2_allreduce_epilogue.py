"""Benchmark: TP=2 all-reduce + residual add + RMSNorm + fp8 quant at a RowParallel site.

Each rank holds a [M, K] bf16 partial sum (what its RowParallel GEMM produced). Providers:
  allreduce   NCCL all_reduce alone (breakdown)
  epilogue    radiance add_rms_quant alone (breakdown)
  separate    NCCL all_reduce, then add_rms_quant: two launches (today's deferred site)
  fused       radiance.kernels.allreduce_add_rms_quant: symmetric-memory partials, one barrier,
              one Triton kernel reading both ranks' partials (no NVLink multicast)
Checks (every rank, before timing): the all-reduced sum equals the bf16 rounding of the fp32
sum of the partials; ``separate`` and ``fused`` equal all-reduce + the reference epilogue,
bit for bit (fp8 codes, scales, new residual). Times in two modes ("eager" and
"graph": CUDA-graph replay), median over trials, the slower rank. The timed all_reduce is in place, so its values
grow over the iterations; only the check uses them.

    python benchmarks/bench_tp2_allreduce_epilogue.py [--json out.json] [--no-fused]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _tp2_common import device, launch, report, time_providers

MS = (1, 8, 16, 32, 64)
KS = (2048, 5120)
EPS = 1e-6
FP8 = torch.float8_e4m3fn


def make_case(m: int, k: int, world: int, device):
    """Every rank's partial (rank order), residual and weight; the same on every rank."""
    g = torch.Generator().manual_seed(1000 * m + k)
    partials = [torch.randn(m, k, generator=g).to(torch.bfloat16).to(device) for _ in range(world)]
    residual = (torch.randn(m, k, generator=g) * 2).to(torch.bfloat16).to(device)
    weight = (torch.randn(k, generator=g) * 0.1).to(torch.bfloat16).to(device)
    return partials, residual, weight


def _same(a, b) -> bool:
    return (torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
            and torch.equal(a[2], b[2]))


def check(rank: int, world: int, m: int, k: int, fused=None) -> dict:
    """Correctness of ``separate`` (and of ``fused``, a TwoRankAllReduceEpilogue, if given)."""
    from radiance.kernels.allreduce_add_rms_quant import allreduce_add_rms_quant_reference
    from radiance.kernels.add_rms_quant import add_rms_quant

    dev = device()
    partials, residual, weight = make_case(m, k, world, dev)
    want = allreduce_add_rms_quant_reference(partials, residual, weight, EPS, 0, FP8)
    y = partials[rank].clone()
    dist.all_reduce(y)
    sum_ok = torch.equal(y, (partials[0].float() + partials[1].float()).to(torch.bfloat16))
    got = add_rms_quant(y, residual, weight, EPS, 0, FP8)
    res = {"M": m, "K": k, "allreduce_exact": sum_ok, "separate_exact": _same(got, want)}
    if fused is not None:
        fused.partial(m).copy_(partials[rank])
        res["fused_exact"] = _same(fused.epilogue(m, residual, weight, EPS, 0, FP8), want)
    return res


def _worker(rank: int, world: int, json_path, want_fused: bool, quick: bool):
    from radiance.kernels.add_rms_quant import add_rms_quant

    dev = device()
    fused = {}
    fused_error = None
    if want_fused:
        try:
            from radiance.kernels.allreduce_add_rms_quant import TwoRankAllReduceEpilogue

            for k in KS:
                fused[k] = TwoRankAllReduceEpilogue(max(MS), k, torch.bfloat16, device=dev)
        except (RuntimeError, ValueError, ImportError, AttributeError) as exc:  # baseline still runs
            fused_error = f"{type(exc).__name__}: {exc}"
            fused = {}
            print(f"rank {rank}: fused setup failed: {fused_error}", flush=True)

    checks, rows = [], []
    for k in KS:
        for m in MS:
            c = check(rank, world, m, k, fused.get(k))
            checks.append(c)
            if rank == 0:
                print(f"M={m:3d} K={k}: {c}", flush=True)
            partials, residual, weight = make_case(m, k, world, dev)
            y = partials[rank].clone()
            # defaults bind this shape's tensors (the lambdas are timed before the next shape)
            provs = {
                "allreduce": lambda y=y: dist.all_reduce(y),
                "epilogue": lambda y=y, r=residual, w=weight: add_rms_quant(y, r, w, EPS, 0, FP8),
                "separate": lambda y=y, r=residual, w=weight: (
                    dist.all_reduce(y), add_rms_quant(y, r, w, EPS, 0, FP8)),
            }
            if k in fused:
                ep = fused[k]
                for buf in ep._bufs:  # both slots hold this rank's partial
                    buf[:m].copy_(partials[rank])
                provs["fused"] = lambda ep=ep, m=m, r=residual, w=weight: ep.epilogue(
                    m, r, w, EPS, 0, FP8)
            rows += time_providers(provs, quick, M=m, K=k)
    if rank == 0:
        report("tp2_allreduce_epilogue", rows, ("M", "K"), json_path, world, fused_error=fused_error,
               checks=checks)
    bad = [c for c in checks if not all(v for kk, v in c.items() if kk.endswith("exact"))]
    if bad:
        raise SystemExit(f"rank {rank}: mismatches {bad}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--no-fused", action="store_true", help="baseline only")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print("needs two GPUs", file=sys.stderr)
        return 2
    launch(_worker, (args.json, not args.no_fused, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
