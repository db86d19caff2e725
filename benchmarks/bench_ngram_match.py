"""Benchmark: per-request n-gram match + continuation over a device-resident context.

Providers:
  torch      a batched PyTorch version (unfold, compare, last hit, gather): the stock way
  ours       the Triton kernel (one program per request, backward scan with early exit)

Two contexts: "miss" (tokens from a 150k vocabulary: almost never a match, the full scan, the
worst case) and "repeat" (a repeating code-like pattern: a match in the latest block).
``--tune`` sweeps the kernel's block and warps.

    python benchmarks/bench_ngram_match.py [--json out.json] [--tune]
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

from radiance.kernels import ngram_match as nm  # noqa: E402

K, NGRAM = 8, 3


def torch_match(ctx, n, k, ngram):
    b, length = ctx.shape
    win = ctx.unfold(1, ngram, 1)                                   # [B, L-ngram+1, ngram]
    tail_idx = (n[:, None] - ngram + torch.arange(ngram, device=ctx.device)).clamp(min=0).long()
    tail = ctx.gather(1, tail_idx)                                  # [B, ngram]
    hit = (win == tail[:, None, :]).all(-1)
    starts = torch.arange(win.shape[1], device=ctx.device)
    hit &= starts[None, :] < (n[:, None] - ngram)
    p = torch.where(hit, starts[None, :], -1).max(dim=1).values     # [B]
    j = torch.arange(k, device=ctx.device)
    src = p[:, None] + ngram + j[None, :]
    ok = (p[:, None] >= 0) & (src < n[:, None])
    cont = torch.where(ok, ctx.gather(1, src.clamp(0, length - 1).long()), -1).int()
    clen = ok.sum(1).int()
    return cont, clen


def contexts(kind, b, length, device):
    g = torch.Generator().manual_seed(0)
    if kind == "miss":
        ctx = torch.randint(0, 150000, (b, length), generator=g, dtype=torch.int32)
    else:
        line = torch.randint(0, 150000, (40,), generator=g, dtype=torch.int32)
        ctx = line.repeat(b, length // 40 + 1)[:, :length].contiguous()
        ctx += torch.arange(b, dtype=torch.int32)[:, None]  # rows differ
    n = torch.full((b,), length, dtype=torch.int32)
    return ctx.to(device), n.to(device)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--tune", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA or ROCm GPU", file=sys.stderr)
        return 2
    import triton
    from triton.testing import do_bench, do_bench_cudagraph

    dev = torch.cuda.get_device_name()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "uncommitted"
    rows, tuned = [], []
    for kind, b, length in itertools.product(["miss", "repeat"], [8, 64], [2048, 8192]):
        ctx, n = contexts(kind, b, length, "cuda")
        want = nm.ngram_match_reference(ctx, n, K, NGRAM)
        got = nm.ngram_match_triton(ctx, n, K, NGRAM)
        assert all(torch.equal(a, c) for a, c in zip(got, want)), kind
        assert all(torch.equal(a, c) for a, c in zip(torch_match(ctx, n, K, NGRAM), want)), kind
        for name, fn in (("torch", lambda: torch_match(ctx, n, K, NGRAM)),
                         ("ours", lambda: nm.ngram_match_triton(ctx, n, K, NGRAM))):
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            ms_g = do_bench_cudagraph(fn, rep=200, return_mode="median")
            rows.append({"provider": name, "context": kind, "B": b, "L": length,
                         "us": ms * 1e3, "us_graph": ms_g * 1e3})
        if args.tune and b == 64 and length == 8192:
            for block, warps in itertools.product([512, 1024, 2048, 4096], [4, 8]):
                fn = lambda: nm._launch(ctx, n, K, NGRAM, block, warps)  # noqa: E731
                ok = all(torch.equal(a, c) for a, c in zip(fn(), want))
                ms = do_bench(fn, warmup=10, rep=100, return_mode="median")
                tuned.append({"context": kind, "block": block, "warps": warps, "ok": ok,
                              "us": ms * 1e3})

    print(f"device: {dev}; triton {triton.__version__}")
    print(f"{'provider':8s} {'context':7s} {'B':>4s} {'L':>6s} {'us':>9s} {'us(graph)':>10s}")
    for r in rows:
        print(f"{r['provider']:8s} {r['context']:7s} {r['B']:4d} {r['L']:6d} {r['us']:9.2f} "
              f"{r['us_graph']:10.2f}")
    for t in sorted(tuned, key=lambda t: (t["context"], t["us"])):
        print(f"  tune {t['context']:6s} block={t['block']:5d} warps={t['warps']} "
              f"{t['us']:.2f} us ok={t['ok']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "ngram_match", "device": dev, "date": time.strftime("%Y-%m-%d"),
                       "commit": commit, "triton": triton.__version__, "k": K, "ngram": NGRAM,
                       "config": {"block": nm.BLOCK, "warps": nm.NUM_WARPS},
                       "rows": rows, "tune": tuned}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
