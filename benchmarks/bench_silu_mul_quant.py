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
    FP8,
    compile_m_dynamic,
    empty_launch,
    mark_m_dynamic,
    measure_shape,
    print_table,
    stock_per_token_quant,
    table_columns,
    write_json,
)

from radiance.kernels import silu_mul_quant as smq

BASELINES = ("compile_stock",)


def stock_chain(gu):
    n = gu.shape[-1] // 2
    return stock_per_token_quant(torch.nn.functional.silu(gu[:, :n]) * gu[:, n:])


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
            rows += measure_shape({"M": m, "N": n}, providers, modes, BASELINES)
    print_table(rows, table_columns(["M", "N"], modes, BASELINES))
    write_json(args.json, "silu_mul_quant", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
