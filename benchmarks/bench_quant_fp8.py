"""Benchmark quant_fp8 (dynamic fp8 quant of a plain activation, one launch) against what the
radiance_fp8 linears ran before it and against vLLM's quant.

    python benchmarks/bench_quant_fp8.py [--json OUT.json] [--ms 8,64,512] [--ks 2048,5120]
        [--groups 0,128] [--modes graph,eager]

Providers (bf16 activations, e4m3fn): ``floor`` (one empty Triton launch), ``reference``
(quantize_reference run eagerly on the GPU: what ``as_codes`` ran for every plain-tensor input
before), ``eager`` (vLLM's QuantFP8.forward_native arithmetic), ``compile_stock`` (torch.compile
of that, M dynamic), ``ours`` (quant_fp8_triton) and ``ours_op`` (torch.ops.radiance.quant_fp8).
Every ``ours`` result is first checked bit for bit against the reference. Timing modes as in
bench_add_rms_quant.
"""
from __future__ import annotations

import torch
from _fp8_epilogue_common import (FMAX, FP8, bench_args, compile_m_dynamic, empty_launch, mark_m_dynamic,
                                  measure_shape, print_table, report, table_columns)

from radiance.kernels import fp8_common as fc
from radiance.kernels import quant_fp8 as qf

BASELINES = ("reference", "compile_stock")


def stock_quant(x: torch.Tensor, group: int = 0):
    """QuantFP8.forward_native per token (group 0) or per group."""
    m, k = x.shape
    xg = x.view(m, k // group if group else 1, group or k).to(torch.float32)
    scale = (xg.abs().amax(dim=-1, keepdim=True) / FMAX).clamp(min=1.0 / (FMAX * 512.0))
    q = (xg * scale.reciprocal()).clamp(-FMAX, FMAX).to(FP8)
    return q.view(m, k), scale.view(m, -1)


def main(argv=None) -> int:
    args = bench_args(__doc__, argv, ms="8,64,512", ks="2048,5120", groups="0,128")
    modes = args.modes
    floor = empty_launch()
    rows = []
    for group in args.groups:
        compiled = compile_m_dynamic(lambda x, g=group: stock_quant(x, g))
        for k in args.ks:
            for m in args.ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3
                mark_m_dynamic(x)
                got = qf.quant_fp8_triton(x, group, FP8)
                want = fc.quantize_reference(x.cpu(), group, FP8)
                exact = torch.equal(got[0].view(torch.uint8).cpu(), want[0].view(torch.uint8)) \
                    and torch.equal(got[1].cpu(), want[1])
                providers = {"floor": floor,
                             "reference": lambda x=x, g=group: fc.quantize_reference(x, g, FP8),
                             "eager": lambda x=x, g=group: stock_quant(x, g),
                             "compile_stock": lambda x=x, c=compiled: c(x),
                             "ours": lambda x=x, g=group: qf.quant_fp8_triton(x, g, FP8),
                             "ours_op": lambda x=x, g=group: torch.ops.radiance.quant_fp8(x, g, FP8)}
                shape_rows = measure_shape({"M": m, "K": k, "group": group}, providers, modes, BASELINES)
                for r in shape_rows:
                    if r["provider"] == "ours":
                        r["bit_exact"] = exact
                rows += shape_rows
                print_table(shape_rows, table_columns(["M", "K", "group"], modes, BASELINES) + ["bit_exact"])
    print("\n# all rows")
    report("quant_fp8", rows, ["M", "K", "group"], args, BASELINES, ("bit_exact",))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
