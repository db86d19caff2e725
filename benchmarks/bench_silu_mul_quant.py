"""Benchmark the fused SiluAndMul + fp8 quant epilogue against what it replaces.

    python benchmarks/bench_silu_mul_quant.py [--json OUT.json] [--ms 8,16,32,64] [--ns 512,2048,5120]

Providers (per-token e4m3fn, bf16): ``floor`` (one empty Triton launch), ``eager`` (vLLM's
SiluAndMul.forward_native + QuantFP8.forward_native), ``compile_stock`` (torch.compile of
that chain, M dynamic), ``ours`` (silu_mul_quant_triton). Timing modes as in
bench_add_rms_quant.
"""
from __future__ import annotations

import torch
from _fp8_epilogue_common import (FP8, bench_args, compile_m_dynamic, empty_launch, mark_m_dynamic, measure_shape,
                                  report, stock_per_token_quant)

from radiance.kernels import silu_mul_quant as smq

BASELINES = ("compile_stock",)


def stock_chain(gu):
    n = gu.shape[-1] // 2
    return stock_per_token_quant(torch.nn.functional.silu(gu[:, :n]) * gu[:, n:])


def main(argv=None) -> int:
    args = bench_args(__doc__, argv, ms="8,16,32,64", ns="512,2048,5120")
    compiled = compile_m_dynamic(stock_chain)
    floor = empty_launch()
    rows = []
    for n in args.ns:
        for m in args.ms:
            gu = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3
            mark_m_dynamic(gu)
            providers = {"floor": floor, "eager": lambda: stock_chain(gu),
                         "compile_stock": lambda: compiled(gu),
                         "ours": lambda: smq.silu_mul_quant_triton(gu, 0, FP8)}
            rows += measure_shape({"M": m, "N": n}, providers, args.modes, BASELINES)
    report("silu_mul_quant", rows, ["M", "N"], args, BASELINES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
