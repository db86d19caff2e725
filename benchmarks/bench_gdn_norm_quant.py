"""Benchmark the fused GDN gated RMSNorm + fp8 quant epilogue against what it replaces.

    python benchmarks/bench_gdn_norm_quant.py [--json OUT.json] [--ms 1,8,16,32,64] [--heads 16,32]

Providers (per-token e4m3fn, bf16, head dim 128): ``floor`` (one empty Triton launch),
``eager`` (vLLM's RMSNormGated.forward_static for group_size None, norm_before_gate, silu,
then QuantFP8.forward_native), ``compile_stock`` (torch.compile of that chain, M dynamic),
``ours`` (gdn_norm_quant_triton). ``z`` is a row-strided view, as the GDN slices it. Timing
modes as in bench_add_rms_quant (graph: CUDA-graph replay; eager: per call).
"""
from __future__ import annotations

import functools

import torch
from _fp8_epilogue_common import (FP8, bench_args, compile_m_dynamic, empty_launch, mark_m_dynamic, measure_shape,
                                  report, stock_per_token_quant)

from radiance.kernels import gdn_norm_quant as gnq

BASELINES = ("eager", "compile_stock")
D = 128
EPS = 1e-6


def stock_chain(x, z, w):
    m, k = x.shape
    xf = x.float().view(m, -1, D)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    out = xf * torch.rsqrt(var + EPS) * w.float()
    out = out * torch.nn.functional.silu(z.float().reshape(m, -1, D))
    return stock_per_token_quant(out.to(x.dtype).view(m, k))


def main(argv=None) -> int:
    args = bench_args(__doc__, argv, ms="1,8,16,32,64", heads="16,32")
    compiled = compile_m_dynamic(stock_chain)
    floor = empty_launch()
    rows = []
    for h in args.heads:
        k = h * D
        w = (1 + 0.2 * torch.randn(D, device="cuda")).to(torch.bfloat16)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.5
            z = (torch.randn(m, 2 * k, device="cuda", dtype=torch.bfloat16) * 3)[:, k:]
            mark_m_dynamic(x, z)
            providers = {"floor": floor, "eager": functools.partial(stock_chain, x, z, w),
                         "compile_stock": functools.partial(compiled, x, z, w),
                         "ours": functools.partial(gnq.gdn_norm_quant_triton, x, z, w, EPS, 0, FP8)}
            rows += measure_shape({"M": m, "H": h, "K": k}, providers, args.modes, BASELINES)
    report("gdn_norm_quant", rows, ["M", "H", "K"], args, BASELINES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
