"""Which decode steps of a timed run replayed no full CUDA graph, by Model Runner V2's own table: from a
`radiance bench` report and vLLM's per-step lines beside it (`step_split.py` reads the same files):

    python benchmarks/graph_misses.py benchmarks/results/REPORT.json [--widened] [--json]

vLLM 0.32's `CudaGraphManager` builds its table from the capture sizes the report's engines ran with
(`compilation-config`), `max-num-seqs` and, for a set with dynamic-draft, the depth schedule the launcher
writes (every depth 1..k); `dispatch` then says which graph each logged decode step (its requests and
tokens) replayed. Only the capture is left out (it needs a GPU): the table and the dispatch are vLLM's code.
`--widened` applies dynamic-draft's widening (radiance/draft/patch_graphs.py) to the sets it patches, as
the tree now does; without it, the table the report's commit ran (docs/benchmarks.md, twenty-sixth session).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:   # run as a script: the repository's root, for its packages
    sys.path.insert(0, str(ROOT))

from benchmarks import step_split  # noqa: E402


def vllm_table(capture_sizes, k: int, schedule=None, max_reqs: int = 32, mode=None, cls=None):
    """vLLM's ``CudaGraphManager`` (or ``cls``, a subclass) with its candidate table built, as after capture.
    ``schedule``: vLLM's ``num_speculative_tokens_per_batch_size`` (None: one depth, k)."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    cls = cls or CudaGraphManager
    m = cls.__new__(cls)   # its __init__ wants a device; the table needs only what _init_candidates reads
    spec = types.SimpleNamespace(num_speculative_tokens_per_batch_size=schedule,
                                 uses_dynamic_speculative_decoding=lambda: bool(schedule))
    m.vllm_config = types.SimpleNamespace(speculative_config=spec, num_speculative_tokens=k,
                                          cache_config=types.SimpleNamespace(use_kda_recoverssm=False))
    m.compilation_config = types.SimpleNamespace(cudagraph_capture_sizes=list(capture_sizes),
                                                 max_cudagraph_capture_size=max(capture_sizes))
    m.cudagraph_mode = mode or CUDAGraphMode.FULL_AND_PIECEWISE
    m.max_num_reqs, m.decode_query_len = max_reqs, k + 1
    m.lora_capture_cases, m.varlen_decode, m.ubatch_runner = [0], False, None
    m._candidates, m._capture_descs, m._lora_dispatch_map, m._max_lora_case = {}, {}, {}, 0
    m._init_candidates()
    m._graphs_captured = True
    return m


def decode_mode(table, requests: int, tokens: int) -> str:
    """The graph mode V2 replays for an all-decode step (a uniform query length when tokens divide)."""
    q = tokens // requests if tokens % requests == 0 else None
    return table.dispatch(requests, tokens, q, 0, max_query_len=q).cg_mode.name


_STEP = re.compile(r"(\d+) context requests, \d+ context tokens, (\d+) generation requests, (\d+) generation tokens")


def read_steps(lines) -> dict[str, list]:
    """Per set, its cells in order: (batch, acceptance label, [(context requests, generation requests,
    generation tokens)])."""
    return step_split.read_cells(lines, step=_STEP, fields=(int, int, int))


def misses(report: dict, cells: dict[str, list], widened: bool = False) -> list[dict]:
    """One row per set, acceptance and batch: the timed runs' decode steps, and those without a full graph."""
    from radiance.draft.patch_graphs import GraphTable
    from radiance.features import draft_depth_tiers

    args = report.get("vllm_args", {})
    sizes = json.loads(args.get("compilation-config", "{}")).get("cudagraph_capture_sizes")
    if not sizes:   # vLLM's own default depends on the GPU and the engine; this reads only what was given
        raise ValueError("the report's engines ran without cudagraph_capture_sizes in their compilation-config")
    max_reqs = int(args.get("max-num-seqs", 32))
    rows = []
    for s in report["sets"]:
        if s.get("runner") != "v2":
            raise ValueError(f"{s['set']}: ran on {s.get('runner')}, not Model Runner V2")
        k = s["depth"]
        dynamic = "dynamic_draft" in s.get("features", [])
        table = vllm_table(sizes, k, draft_depth_tiers(k) if dynamic else None, max_reqs)
        if widened and dynamic:
            GraphTable().widen_manager(table)   # what the patch does to the engine's table
        acc: dict[tuple, list[int]] = {}
        for batch, label, steps in cells.get(s["set"], []):
            decode = [(r, t) for ctx, r, t in step_split.timed_run(steps) if ctx == 0 and r > 0]
            missed = [f"{r}x{t // r if t % r == 0 else '?'}" for r, t in decode if decode_mode(table, r, t) != "FULL"]
            a = acc.setdefault((label, batch), [0, 0, []])
            a[0] += len(decode)
            a[1] += len(missed)
            a[2] += missed
        for (label, batch), (n, m, which) in acc.items():
            rows.append({"set": s["set"], "acceptance": label, "batch": batch, "decode_steps": n,
                         "not_full": m, "which": sorted(set(which))})
    return rows


def load(report_path: Path) -> tuple[dict, dict]:
    return step_split.load(report_path, read=read_steps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--widened", action="store_true", help="with dynamic-draft's widening of the table")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    args = ap.parse_args(argv)
    try:
        rows = misses(*load(args.report), widened=args.widened)
    except (OSError, ValueError) as exc:
        print(f"graph_misses: {args.report}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| set | acceptance | B | decode steps (all rounds) | without a full graph | requests x query length |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['set']} | {r['acceptance']} | {r['batch']} | {r['decode_steps']} | {r['not_full']} "
              f"| {', '.join(r['which'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
