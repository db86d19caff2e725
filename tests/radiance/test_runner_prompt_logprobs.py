"""Prompt logprobs the drafter cannot overwrite (radiance/runner_prompt_logprobs.py, vLLM issue 53488).

On a GPU the target's hidden states can live in CUDA-graph pool memory that the drafter's graphs reuse
before V1's bookkeeping reads them for prompt logprobs. There is no graph pool on this CPU machine, so
this test fakes that boundary: a runner whose step leaves its hidden states in a buffer that a "drafter"
then overwrites. The hook runs on vLLM's real ExecuteModelState."""
from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.worker.gpu_model_runner import ExecuteModelState  # noqa: E402

from radiance.runner_prompt_logprobs import PromptLogprobsPatch, RunnerHooks  # noqa: E402


def _runner_class(pool: torch.Tensor):
    class FakeGraphPoolRunner:
        speculative_config = types.SimpleNamespace(method="mtp")
        num_prompt_logprobs: dict[str, int] = {}
        execute_model_state = None

        def execute_model(self, n_tokens: int):
            pool[:n_tokens] = torch.arange(n_tokens * pool.shape[1], dtype=pool.dtype).view(n_tokens, -1)
            fields = dict.fromkeys(ExecuteModelState._fields)
            fields["hidden_states"] = pool[:n_tokens]   # the last graph's output, a view into the pool
            self.execute_model_state = ExecuteModelState(**fields)

    return FakeGraphPoolRunner


@pytest.fixture
def hooked():
    pool = torch.zeros(16, 4)
    cls = _runner_class(pool)
    patch = PromptLogprobsPatch()
    assert patch.guard() is None
    patch.hook(RunnerHooks, owner=cls)
    yield patch, cls, pool
    patch.revert()


def test_prompt_logprob_steps_keep_the_targets_hidden_states_when_the_drafter_reuses_their_memory(hooked):
    patch, cls, pool = hooked
    runner = cls()
    runner.num_prompt_logprobs = {"req-0": 0}
    runner.execute_model(6)
    kept = runner.execute_model_state.hidden_states
    want = pool[:6].clone()
    pool.fill_(-7.0)  # the drafter's graphs write into the pool before bookkeeping reads it
    assert kept.data_ptr() != pool.data_ptr() and torch.equal(kept, want)
    assert patch.copies == 1


def test_other_steps_are_left_as_vllm_made_them(hooked):
    patch, cls, pool = hooked
    runner = cls()
    runner.execute_model(3)  # no request wants prompt logprobs
    assert runner.execute_model_state.hidden_states.data_ptr() == pool.data_ptr()
    runner.num_prompt_logprobs = {"req-0": 0}
    runner.speculative_config = None  # no drafter runs between the forward and the bookkeeping
    runner.execute_model(3)
    assert runner.execute_model_state.hidden_states.data_ptr() == pool.data_ptr()
    assert patch.copies == 0
