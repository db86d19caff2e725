"""Shared timing helpers of the fp8-stream benchmarks (bench_add_rms_quant,
bench_gdn_norm_quant, bench_quant_fp8, bench_fp8_gemm). Not collected by pytest (no test_ prefix)."""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The stock chains quantise as vLLM 0.32.0's QuantFP8.forward_native does, per token, to e4m3fn.
FP8 = torch.float8_e4m3fn
FMAX = 448.0


def commit(tree: Path = REPO, unknown: str = "uncommitted") -> str:
    """The commit a run measured (``git rev-parse --short HEAD`` of ``tree``), ``+dirty`` when the
    working tree differs from it; ``unknown`` where git cannot say."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True,
                               text=True, timeout=10)
        if out.returncode != 0:
            return unknown
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except Exception:
        return unknown


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _triton():
    import triton
    import triton.language as tl

    return triton, tl


_EMPTY = {}


def empty_launch(programs: int = 1, num_warps: int = 4):
    """A callable launching one empty Triton kernel over ``programs`` programs: the single-launch
    floor (one program), or the dispatch cost of a grid of that size."""
    key = (programs, num_warps)
    if key not in _EMPTY:
        triton, tl = _triton()
        if "kernel" not in _EMPTY:
            @triton.jit
            def _empty_kernel(x_ptr):
                pass

            _EMPTY["kernel"] = _empty_kernel
            _EMPTY["buf"] = torch.empty(1, device="cuda")
        kernel, buf = _EMPTY["kernel"], _EMPTY["buf"]
        _EMPTY[key] = lambda: kernel[(programs,)](buf, num_warps=num_warps)
    return _EMPTY[key]


def time_us(fn, mode: str) -> float:
    """Median microseconds per call. ``graph``: fn replayed from a CUDA graph (the decode
    setting: no CPU launch cost, kernel gaps inside the graph remain). ``eager``:
    triton.testing.do_bench (L2 flushed before each call; the flush keeps the GPU busy
    while the CPU enqueues, so this is close to GPU time too)."""
    triton, _ = _triton()
    fn()
    torch.cuda.synchronize()
    if mode == "graph":
        return 1000.0 * float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
    return 1000.0 * float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def stock_per_token_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """QuantFP8.forward_native's per-token dynamic quant, the tail of every stock chain."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = (amax / FMAX).clamp(min=1.0 / (FMAX * 512.0))
    return (x.to(torch.float32) * scale.reciprocal()).clamp(-FMAX, FMAX).to(FP8), scale


def compile_m_dynamic(fn):
    """torch.compile as vLLM uses it: the token dim dynamic, the hidden size static (a new
    K recompiles statically rather than turning K symbolic)."""
    torch._dynamo.config.automatic_dynamic_shapes = False
    return torch.compile(fn)


def mark_m_dynamic(*tensors: torch.Tensor) -> None:
    for t in tensors:
        torch._dynamo.mark_dynamic(t, 0)


def count_kernels(fn) -> int:
    """GPU kernels one call launches (after warm-up), from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())


def measure_shape(shape: dict, providers: dict, modes: list[str], baselines: tuple[str, ...]) -> list[dict]:
    """One row per provider for one problem shape: microseconds in each timing mode and kernels
    per call; the ``ours`` row also gets its speed-up over each baseline and its ratio to the
    ``floor`` row."""
    rows = []
    for name, fn in providers.items():
        row = {**shape, "provider": name}
        for mode in modes:
            row[f"{mode}_us"] = time_us(fn, mode)
        try:
            row["kernels"] = count_kernels(fn)
        except Exception as exc:  # profiler unavailable: leave the count out
            row["kernels"] = None
            row["kernels_error"] = type(exc).__name__
        rows.append(row)
    by = {r["provider"]: r for r in rows}
    ours = by["ours"]
    for mode in modes:
        key = f"{mode}_us"
        for base in baselines:
            ours[f"{mode}_vs_{base}"] = by[base][key] / ours[key]
        ours[f"{mode}_vs_floor"] = ours[key] / by["floor"][key]
    return rows


def bench_args(doc: str, argv, *, modes: str = "graph,eager", flags: tuple[str, ...] = (), **lists: str):
    """The epilogue benchmarks' command line: ``--json``, ``--modes`` (a comma list, parsed to a
    list), one comma list of integers per keyword (``ms="8,64"``: ``--ms``, parsed to [8, 64]) and
    the store-true ``flags``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--modes", default=modes)
    for name, default in lists.items():
        p.add_argument(f"--{name}", default=default)
    for flag in flags:
        p.add_argument(f"--{flag}", action="store_true")
    args = p.parse_args(argv)
    args.modes = args.modes.split(",")
    for name in lists:
        setattr(args, name, [int(v) for v in getattr(args, name).split(",")])
    return args


def report(name: str, rows: list[dict], shape: list[str], args, baselines: tuple[str, ...],
           extra_cols: tuple[str, ...] = ()) -> None:
    """The table of every row, then the run's JSON (``args.json``, if given)."""
    print_table(rows, table_columns(shape, args.modes, baselines) + list(extra_cols))
    write_json(args.json, name, rows)


def table_columns(shape: list[str], modes: list[str], baselines: tuple[str, ...]) -> list[str]:
    return shape + ["provider", "kernels"] + [f"{m}_us" for m in modes] + \
        [f"{m}_vs_{s}" for m in modes for s in (*baselines, "floor")]


def write_json(path: str | None, name: str, rows: list[dict], extra: dict | None = None) -> None:
    doc = {"benchmark": name, "date": datetime.date.today().isoformat(), "device": device_name(),
           "torch": torch.__version__, "triton": _triton()[0].__version__, "commit": commit(),
           **(extra or {}), "rows": rows}
    text = json.dumps(doc, indent=1)
    if path:
        Path(path).write_text(text)
    print(f"# {name}: {len(rows)} rows" + (f" -> {path}" if path else ""))


def print_table(rows: list[dict], cols: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(w) for c, w in zip(cols, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "" if v is None else str(v)
