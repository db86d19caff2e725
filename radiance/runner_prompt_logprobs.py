"""Prompt logprobs that the drafter cannot overwrite (vLLM 0.32, Model Runner V1).

V1's ``sample_tokens`` runs a padded drafter (MTP, EAGLE, DFlash) before its bookkeeping computes prompt
logprobs from the target's ``hidden_states``. On a GPU that tensor is, for a batch that ran through
piecewise CUDA graphs (at most the capture limit), the last graph's output buffer, and every graph shares
one memory pool: the drafter's own graphs may reuse that memory, and prompt logprobs then come from the
drafter's activations while generation (sampled before the drafter ran) is unaffected. vLLM issue 53488
(fix proposed upstream in PR 53520). The gate's target check scores its held text this way, and so does
`radiance bench`'s lossless re-scoring; on the H200 a lone re-scored request disagreed with the engine's own
first token in every V1 run without this copy, scored on V2, and scores on V1 with it (docs/benchmarks.md,
fifth session).

Hook (vLLM 0.32.0): ``GPUModelRunner.execute_model`` (the CPU runner inherits it). When the step it leaves
for ``sample_tokens`` has a drafter and a request that wants prompt logprobs, its ``hidden_states`` are
replaced by a copy taken right after the forward, on the same stream: the drafter and the bookkeeping read
the same values they would have read, from memory outside the graph pool. Any other step is untouched and
costs one dictionary check. Always on with the plugin; V2 computes prompt logprobs its own way and is not
hooked.
"""
from __future__ import annotations

import logging

from .patching import Hooks, Patch, resolve

logger = logging.getLogger("radiance")

_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
_STATE = "vllm.v1.worker.gpu_model_runner.ExecuteModelState"
VIA = "_radiance_prompt_logprobs"


def wants_copy(runner, state) -> bool:
    """A step whose prompt logprobs are computed after a drafter runs."""
    return (state is not None and getattr(runner, "speculative_config", None) is not None
            and bool(getattr(runner, "num_prompt_logprobs", None)))


class RunnerHooks(Hooks):
    """``GPUModelRunner``: the step's hidden states, copied where prompt logprobs follow the drafter."""

    target = _RUNNER
    via = VIA

    def execute_model(self, *args, **kwargs):
        out = self._orig_execute_model(*args, **kwargs)
        state = getattr(self, "execute_model_state", None)
        if wants_copy(self, state):
            self.execute_model_state = state._replace(hidden_states=state.hidden_states.clone())
            patch = self._radiance_prompt_logprobs
            if patch.copies == 0:
                logger.info("radiance: prompt logprobs read a copy of the target's hidden states in steps "
                            "where the drafter runs first (vLLM issue 53488)")
            patch.copies += 1
        return out


class PromptLogprobsPatch(Patch):
    name = "prompt_logprobs.drafter_safe"
    feature = ""  # always on with the plugin: a correctness fix for vLLM itself, no knob
    hook_points = (f"{_RUNNER}.execute_model",)
    relied_on = (_STATE,)  # read, never replaced

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0  # steps whose hidden states were copied (tests)

    def guard(self) -> str | None:
        try:
            fields = getattr(resolve(_STATE)[2], "_fields", ())
        except LookupError as exc:
            return f"{_STATE} missing ({exc})"
        if "hidden_states" not in fields:
            return f"ExecuteModelState has no hidden_states field ({', '.join(fields) or 'not a NamedTuple'})"
        return None

    def apply(self) -> None:
        self.hook(RunnerHooks)


PATCHES = [PromptLogprobsPatch()]
