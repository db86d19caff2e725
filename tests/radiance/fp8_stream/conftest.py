"""One single-rank gloo tensor-parallel group for every fp8-stream test that builds real vLLM
layers (model builds and linear layers share it; vLLM allows one per process)."""
from __future__ import annotations

import socket

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tp1_group():
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    owner = not model_parallel_is_initialized()
    if owner:
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
            initialize_model_parallel(1, 1)
    yield
    if owner:
        destroy_model_parallel()
        destroy_distributed_environment()
