"""Real vLLM layers on CPU need a (single-process, gloo) tensor-parallel group and a config;
the w4-drafter and int4-head patch tests both build them."""
from __future__ import annotations

import socket

import pytest


def init_vllm_cpu() -> None:
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )

    if model_parallel_is_initialized():
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(1, 1)


@pytest.fixture(scope="module")
def vllm_cpu():
    vllm = pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        init_vllm_cpu()
        yield vllm
