"""Benchmark the W8A8 fp8 GEMM paths on pre-quantised activations.

    python benchmarks/bench_fp8_gemm.py [--json OUT.json] [--ms 1,8,64,512]

Providers: ``bf16`` (F.linear on bf16, cuBLAS: what an unquantised linear costs),
``scaled_mm`` (torch._scaled_mm, per-token x per-channel, where the device has it),
``triton_tc`` (our kernel, per-token x per-channel), ``triton_gb`` (our kernel, per-group
x 128x128 block scales, the layout of fp8 checkpoints). Timing: do_bench median with the
L2 flushed before each call (weights come from HBM, as in a decode step).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from _fp8_epilogue_common import print_table, time_us, write_json

from radiance.kernels import fp8_gemm as fg

SHAPES = {"o_proj 2048->5120": (5120, 2048), "qkv 5120->2048": (2048, 5120)}  # name: (N, K)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--ms", default="1,8,64,512")
    args = p.parse_args(argv)
    rows = []
    for shape, (n, k) in SHAPES.items():
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
        wq = (w16 * 20).to(torch.float8_e4m3fn)
        sw_c = torch.full((n,), 0.05, device="cuda")
        sw_b = torch.full((n // 128, k // 128), 0.05, device="cuda")
        for m in [int(x) for x in args.ms.split(",")]:
            x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            aq = x16.to(torch.float8_e4m3fn)
            sa_t = torch.ones(m, 1, device="cuda")
            sa_g = torch.ones(m, k // 128, device="cuda")
            providers = {"bf16": lambda: F.linear(x16, w16),
                         "triton_tc": lambda: fg.fp8_gemm_triton(aq, sa_t, wq, sw_c),
                         "triton_gb": lambda: fg.fp8_gemm_triton(aq, sa_g, wq, sw_b)}
            if fg.scaled_mm_supported(aq, sa_t, wq, sw_c, torch.bfloat16):
                providers["scaled_mm"] = lambda: fg.scaled_mm(aq, sa_t, wq, sw_c, backend="scaled_mm")
            for name, fn in providers.items():
                us = time_us(fn, "eager")
                gbs = (n * k * (2 if name == "bf16" else 1)) / (us * 1e-6) / 1e9
                rows.append({"shape": shape, "M": m, "provider": name, "eager_us": us,
                             "weight_GB/s": gbs})
    print_table(rows, ["shape", "M", "provider", "eager_us", "weight_GB/s"])
    write_json(args.json, "fp8_gemm", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
