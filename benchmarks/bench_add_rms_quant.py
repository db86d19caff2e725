"""Benchmark the fused add + RMSNorm + fp8 quant epilogue against what it replaces.

    python benchmarks/bench_add_rms_quant.py [--json OUT.json] [--ms 8,16,32,64] [--ks 2048,5120]

Providers (per-token e4m3fn, bf16 activations, M decode-sized):
  floor          one empty Triton kernel: the single-launch floor, measured in the same run
  eager          stock chain in eager PyTorch: vLLM 0.32.0 GemmaRMSNorm.forward_native's
                 arithmetic (fused_add_rms_norm native) + QuantFP8.forward_native per token
  compile_stock  torch.compile(M dynamic) of that stock chain (what vLLM's inductor does)
  compile_ref    torch.compile(M dynamic) of add_rms_quant_reference (the exact reference)
  ours           add_rms_quant_triton (one launch)
  ours_op        torch.ops.radiance.add_rms_quant (custom-op dispatch on top)
Each in two timing modes (see _fp8_epilogue_common.time_us): ``graph`` (CUDA-graph replay,
the decode setting) and ``eager``. ``kernels``: GPU kernels per call, from the profiler.
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

from radiance.kernels import add_rms_quant as arq

EPS = 1e-6
BASELINES = ("compile_stock", "compile_ref")


def stock_chain(y, r, w, eps=EPS):
    x = y.to(torch.float32) + r.to(torch.float32)
    new_r = x.to(y.dtype)
    var = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    normed = (x * (w.float() + 1.0)).to(y.dtype)
    q, scale = stock_per_token_quant(normed)
    return q, scale, new_r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--ms", default="8,16,32,64")
    p.add_argument("--ks", default="2048,5120")
    p.add_argument("--modes", default="graph,eager")
    args = p.parse_args(argv)
    ms = [int(x) for x in args.ms.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    modes = args.modes.split(",")

    compiled_stock = compile_m_dynamic(stock_chain)
    compiled_ref = compile_m_dynamic(
        lambda y, r, w: arq.add_rms_quant_reference(y, r, w, EPS, 0, FP8))
    floor = empty_launch()
    rows = []
    for k in ks:
        for m in ms:
            y = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 4
            w = torch.randn(k, device="cuda", dtype=torch.bfloat16) * 0.1
            mark_m_dynamic(y, r)
            providers = {
                "floor": floor,
                "eager": lambda: stock_chain(y, r, w),
                "compile_stock": lambda: compiled_stock(y, r, w),
                "compile_ref": lambda: compiled_ref(y, r, w),
                "ours": lambda: arq.add_rms_quant_triton(y, r, w, EPS, 0, FP8),
                "ours_op": lambda: torch.ops.radiance.add_rms_quant(y, r, w, EPS, 0, FP8),
            }
            rows += measure_shape({"M": m, "K": k}, providers, modes, BASELINES)
    print_table(rows, table_columns(["M", "K"], modes, BASELINES))
    write_json(args.json, "add_rms_quant", rows,
               {"note": "per-token e4m3fn, bf16; *_vs_compile_*: speed-up of ours; vs_floor: "
                        "ours / empty launch"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
