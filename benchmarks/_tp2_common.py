"""Shared pieces of the two-GPU benchmarks (bench_tp2_*): process launch, cross-rank timing.
Not collected by pytest (no test_ prefix)."""
from __future__ import annotations

import os
import socket
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# NVLink multicast can take a shared host's GPUs out of service: keep it off in every child too.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def device() -> torch.device:
    """This rank's GPU; the CPU where there is none (the correctness halves also run on gloo)."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _child(rank: int, world: int, port: int, fn, args):
    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def launch(fn, args=(), world: int = 2) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` GPUs: under torchrun in this process, else
    one spawned process per GPU."""
    os.environ.update(NO_MULTICAST)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        try:
            fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        return
    import torch.multiprocessing as mp

    mp.spawn(_child, args=(world, _free_port(), fn, args), nprocs=world, join=True)


def _timed(run, iters: int, trials: int) -> float:
    """Median over trials of the per-iteration time (us); ranks start each trial together."""
    out = []
    for _ in range(trials):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / iters)
    # the slower rank sets the pace of a collective pipeline
    t = torch.tensor([statistics.median(out)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def eager_us(fn, iters: int = 200, trials: int = 5) -> float:
    """Per-call time of ``fn`` issued eagerly back to back (host launch cost included)."""
    for _ in range(5):
        fn()

    def run():
        for _ in range(iters):
            fn()

    return _timed(run, iters, trials)


def graph_us(fn, calls: int = 20, reps: int = 20, trials: int = 5) -> float:
    """Per-call time with ``calls`` calls captured in one CUDA graph (the decode setting: no
    host launch cost). NaN, with the reason printed, where capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(4):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        dist.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()

        def run():
            for _ in range(reps):
                graph.replay()

        return _timed(run, calls * reps, trials)
    except RuntimeError as exc:  # reported, not fatal: eager numbers still stand
        print(f"  graph capture failed: {type(exc).__name__}: {exc}", flush=True)
        return float("nan")


def time_providers(providers: dict, quick: bool, **shape) -> list[dict]:
    """One row per provider: the shape, eager and CUDA-graph µs (fewer trials with ``quick``)."""
    return [{"provider": name, **shape, "us_eager": eager_us(fn, iters=50 if quick else 200),
             "us_graph": graph_us(fn, reps=5 if quick else 20)} for name, fn in providers.items()]


def report(bench: str, rows: list[dict], shape: tuple[str, ...], json_path, world: int, **extra) -> None:
    """Rank 0's closing words: the table of ``rows`` and, with ``json_path``, the run's JSON (device,
    date, commit, versions, ``extra``, the rows)."""
    import json
    import time

    import triton
    from _fp8_epilogue_common import commit, print_table

    print()
    print_table(rows, ["provider", *shape, "us_eager", "us_graph"])
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"bench": bench, "device": f"{world}x {torch.cuda.get_device_name()}",
                       "date": time.strftime("%Y-%m-%d"), "commit": commit(),
                       "torch": torch.__version__, "triton": triton.__version__,
                       "nccl": ".".join(map(str, torch.cuda.nccl.version())), **extra, "rows": rows},
                      f, indent=1)
