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
    compile_m_dynamic,
    count_kernels,
    empty_launch,
    mark_m_dynamic,
    print_table,
    time_us,
    write_json,
)

from radiance.kernels import add_rms_quant as arq

FP8 = torch.float8_e4m3fn
FMAX = 448.0
EPS = 1e-6


def stock_chain(y, r, w, eps=EPS):
    x = y.to(torch.float32) + r.to(torch.float32)
    new_r = x.to(y.dtype)
    var = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    normed = (x * (w.float() + 1.0)).to(y.dtype)
    amax = normed.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FMAX).clamp(min=1.0 / (FMAX * 512.0))
    q = (normed.to(torch.float32) * scale.reciprocal()).clamp(-FMAX, FMAX).to(FP8)
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
            for name, fn in providers.items():
                row = {"M": m, "K": k, "provider": name}
                for mode in modes:
                    row[f"{mode}_us"] = time_us(fn, mode)
                try:
                    row["kernels"] = count_kernels(fn)
                except Exception as exc:  # profiler unavailable: leave the count out
                    row["kernels"] = None
                    row["kernels_error"] = type(exc).__name__
                rows.append(row)
            by = {r_["provider"]: r_ for r_ in rows if r_["M"] == m and r_["K"] == k}
            for mode in modes:
                key = f"{mode}_us"
                ours = by["ours"][key]
                by["ours"][f"{mode}_vs_compile_stock"] = by["compile_stock"][key] / ours
                by["ours"][f"{mode}_vs_compile_ref"] = by["compile_ref"][key] / ours
                by["ours"][f"{mode}_vs_floor"] = ours / by["floor"][key]
    cols = ["M", "K", "provider", "kernels"] + [f"{m}_us" for m in modes] + \
        [f"{m}_{s}" for m in modes for s in ("vs_compile_stock", "vs_compile_ref", "vs_floor")]
    print_table(rows, cols)
    write_json(args.json, "add_rms_quant", rows,
               {"note": "per-token e4m3fn, bf16; *_vs_compile_*: speed-up of ours; vs_floor: "
                        "ours / empty launch"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
