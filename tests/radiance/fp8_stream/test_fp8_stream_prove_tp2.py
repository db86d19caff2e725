"""The fused epilogue's load-time self-test on a real two-rank group (two processes, gloo, vLLM's own
TP group on CPU): it passes as it is, and a difference planted on one rank turns it off on both with the
same line, without leaving either rank waiting in a collective (every rank runs every check's
all-reduces, whatever it found)."""
from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

pytest.importorskip("vllm")

from wrong_sum import planted_wrong_sum  # noqa: E402


def _rank_main(rank: int, port: int, out) -> None:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

    from radiance.fp8_stream import fused_allreduce as fa

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=2, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(2, 1)
        weight = (torch.randn(256, generator=torch.Generator().manual_seed(0)) * 0.1).to(torch.bfloat16)
        args = (weight, 1e-6, 0, torch.float8_e4m3fn, torch.bfloat16, torch.device("cpu"))
        first = fa.prove(*args)
        if rank == 1:  # a wrong sum on this rank only
            fa._TP2_OP = planted_wrong_sum(fa._TP2_OP, 0)
        fa._PROVEN.clear()
        out.put((rank, first, fa.prove(*args)))


def test_prove_passes_on_two_ranks_and_a_planted_difference_turns_it_off_on_both():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:  # a rank left waiting in a collective shows here as a timeout, not a hung test run
        got = {rank: (first, planted) for rank, first, planted in (out.get(timeout=240) for _ in procs)}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    line = "rank 1: M=1: sum (new residual): 1 of 256 differ against gloo's all-reduce + add_rms_quant"
    assert got == {0: ((True, ""), (False, line)), 1: ((True, ""), (False, line))}, got
