"""Benchmark the fused SiluAndMul + fp8 quant epilogue against what it replaces.

    python benchmarks/bench_silu_mul_quant.py [--json OUT.json] [--ms 8,16,32,64] [--ns 512,2048,5120]

Providers (per-token e4m3fn, bf16): ``floor`` (one empty Triton launch), ``eager`` (vLLM's
SiluAndMul.forward_native + QuantFP8.forward_native), ``compile_stock`` (torch.compile of
that chain, M dynamic), ``ours`` (silu_mul_quant_triton). Timing modes as in
bench_add_rms_quant.
"""
from __future__ import annotations

import argparse

import torch
from _fp8_epilogue_common import (
    compile_m_dynamic,
    count_kernels,
    empty_launch,
    mark_m_dynamic,
    print_table,
    time_us,
    write_json,
)

from radiance.kernels import silu_mul_quant as smq

FP8 = torch.float8_e4m3fn
FMAX = 448.0


def stock_chain(gu):
    n = gu.shape[-1] // 2
    h = torch.nn.functional.silu(gu[:, :n]) * gu[:, n:]
    amax = h.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FMAX).clamp(min=1.0 / (FMAX * 512.0))
    return (h.to(torch.float32) * scale.reciprocal()).clamp(-FMAX, FMAX).to(FP8), scale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--ms", default="8,16,32,64")
    p.add_argument("--ns", default="512,2048,5120")
    p.add_argument("--modes", default="graph,eager")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    compiled = compile_m_dynamic(stock_chain)
    floor = empty_launch()
    rows = []
    for n in [int(x) for x in args.ns.split(",")]:
        for m in [int(x) for x in args.ms.split(",")]:
            gu = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3
            mark_m_dynamic(gu)
            providers = {"floor": floor, "eager": lambda: stock_chain(gu),
                         "compile_stock": lambda: compiled(gu),
                         "ours": lambda: smq.silu_mul_quant_triton(gu, 0, FP8)}
            for name, fn in providers.items():
                row = {"M": m, "N": n, "provider": name}
                for mode in modes:
                    row[f"{mode}_us"] = time_us(fn, mode)
                try:
                    row["kernels"] = count_kernels(fn)
                except Exception:
                    row["kernels"] = None
                rows.append(row)
            by = {r["provider"]: r for r in rows if r["M"] == m and r["N"] == n}
            for mode in modes:
                by["ours"][f"{mode}_vs_compile_stock"] = by["compile_stock"][f"{mode}_us"] / by["ours"][f"{mode}_us"]
                by["ours"][f"{mode}_vs_floor"] = by["ours"][f"{mode}_us"] / by["floor"][f"{mode}_us"]
    cols = ["M", "N", "provider", "kernels"] + [f"{m}_us" for m in modes] + \
        [f"{m}_{s}" for m in modes for s in ("vs_compile_stock", "vs_floor")]
    print_table(rows, cols)
    write_json(args.json, "silu_mul_quant", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
