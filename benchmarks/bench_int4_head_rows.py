"""int4-head at the rows a speculative step sends through the head: W4A16 vs the bf16 head, per M.

    python benchmarks/bench_int4_head_rows.py [--json OUT] [--commit SHA]

Verification sends B x (k + 1) rows through the head (5 .. 165 at B <= 32, k = 4) and the MTP drafter
B rows per slot; the kernel was tuned for decode M <= 64 and re-reads its weight per 64-row tile above.
Two timings per provider and M, both what a step sees:
* ``eager_us``: back-to-back calls, host launch cost included (vLLM computes logits outside its
  compiled graph: this is how the head runs), the same function the speed rule times at load
  (``radiance.lmhead_int4.speed``);
* ``graph_us``: the device time alone (one CUDA graph of the calls, ``triton.testing.do_bench``).
Providers: ``bf16`` (F.linear, cuBLAS), ``w4`` (the op's own path for M: the kernel, or dequantise +
matmul above LARGE_M), ``dequant`` (dequantise + matmul at every M). Shapes: Qwen3.5-27B's head whole
(TP=1) and per rank (TP=2), and the trained tiny model's 4096 x 256.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _fp8_epilogue_common import commit  # noqa: E402

from radiance.kernels import w4a16_gemm as wk  # noqa: E402
from radiance.lmhead_int4 import speed  # noqa: E402
from radiance.w4 import quant  # noqa: E402

SHAPES = {"head_248320x5120": (248320, 5120), "head_124160x5120": (124160, 5120), "tiny_head_4096x256": (4096, 256)}
MS = (1, 2, 4, 5, 8, 10, 16, 20, 32, 40, 64, 80, 128, 160, 165)
GROUP = 128


def graph_us(fn, x, reps: int = 10) -> float:
    import triton

    fn(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn(x)
    return triton.testing.do_bench(g.replay, warmup=5, rep=50) * 1e3 / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--commit", default=None, help="the commit measured (the device copy's git metadata is stale)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_int4_head_rows: no GPU here; nothing to time", file=sys.stderr)
        return 0
    dev = torch.device("cuda")
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w = (torch.randn((n, k), device=dev) * 0.02).to(torch.bfloat16)
        qw, sc = quant.quantize_pack(w, GROUP, scale_dtype=torch.bfloat16)
        providers = {
            "bf16": lambda x: F.linear(x, w),
            "w4": lambda x: wk.gemm(x, qw, sc, GROUP),
            "dequant": lambda x: wk._dequant_matmul(x, qw, sc, GROUP),
        }
        for m in MS:
            x = torch.randn((m, k), device=dev).to(torch.bfloat16)
            row = {"shape": name, "n": n, "k": k, "m": m}
            for p, fn in providers.items():
                if p == "dequant" and m < 64:
                    continue
                row[f"{p}_eager_us"] = round(speed.eager_us(fn, x), 2)
                row[f"{p}_graph_us"] = round(graph_us(fn, x), 2)
            row["w4_vs_bf16_eager"] = round(row["bf16_eager_us"] / row["w4_eager_us"], 3)
            row["w4_vs_bf16_graph"] = round(row["bf16_graph_us"] / row["w4_graph_us"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        del w, qw, sc
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({
            "bench": "int4_head_rows", "device": torch.cuda.get_device_name(0),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": args.commit or commit(), "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
