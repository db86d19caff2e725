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


# -- the scoring scope (SCORING): which head calls compute prompt logprobs ---------------------------------

def test_the_scoring_scope_brackets_v1_prompt_logprobs_and_nothing_else():
    from radiance.runner_prompt_logprobs import PromptScoringScope, ScoringHooks

    class FakeRunner:
        num_prompt_logprobs: dict[str, int] = {}

        def _get_prompt_logprobs_dict(self, hidden_states, num_scheduled_tokens):
            return {"inside": scope.active()}

    scope = PromptScoringScope()
    scope.hook(ScoringHooks, owner=FakeRunner)
    try:
        runner = FakeRunner()
        assert runner._get_prompt_logprobs_dict(None, {}) == {"inside": False}   # no request asks: untouched
        runner.num_prompt_logprobs = {"req-0": 0}
        assert runner._get_prompt_logprobs_dict(None, {}) == {"inside": True}
        assert not scope.active()
    finally:
        scope.revert()


def test_the_scoring_scope_brackets_v2s_prompt_logprob_worker_and_unwinds_on_errors():
    from radiance.runner_prompt_logprobs import PromptScoringScope, V2ScoringHooks

    class FakeWorker:
        def compute_prompt_logprobs(self, logits_fn, *args):
            return logits_fn()

        def compute_prompt_token_id_logprobs(self, logits_fn, *args):
            raise RuntimeError("boom")

    scope = PromptScoringScope()
    scope.hook(V2ScoringHooks, owner=FakeWorker)
    try:
        worker = FakeWorker()
        assert worker.compute_prompt_logprobs(scope.active) is True
        with pytest.raises(RuntimeError):
            worker.compute_prompt_token_id_logprobs(scope.active)
        assert not scope.active()
    finally:
        scope.revert()


def test_the_scoring_scope_is_installed_by_int4_head_only():
    """The stock reference (every feature off) must score stock: nothing is bracketed without int4-head."""
    from radiance import runner_prompt_logprobs
    from radiance.lmhead_int4.patch import PATCHES as HEAD_PATCHES

    assert runner_prompt_logprobs.SCORING in HEAD_PATCHES
    assert runner_prompt_logprobs.SCORING not in runner_prompt_logprobs.PATCHES


def test_the_stock_engine_brackets_nothing(monkeypatch):
    """``radiance gate --record-reference`` starts the engine with every feature knob at 0: the plugin then
    installs no scoring scope, and its prompt logprobs come from vLLM's own head calls."""
    from radiance import plugin
    from radiance.features import FEATURES
    from radiance.runner_prompt_logprobs import SCORING

    for feat in FEATURES:
        monkeypatch.setenv(feat.knob, "0")
    patches, _ = plugin.load_patches()
    assert SCORING not in patches
    monkeypatch.setenv("RADIANCE_INT4_HEAD", "1")
    assert SCORING in plugin.load_patches()[0]
