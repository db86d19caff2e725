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

The scoring scope (``SCORING``, installed with int4-head, which lists it in its ``PATCHES``): the head calls
that compute prompt logprobs are told apart from every other head call by a bracket around the runner's
prompt-logprob computation, V1's ``GPUModelRunner._get_prompt_logprobs_dict`` and V2's
``PromptLogprobsWorker.compute_prompt_logprobs`` / ``compute_prompt_token_id_logprobs``; each calls the
model's ``compute_logits`` on the prompt's hidden states, and nothing else runs inside. int4-head reads
``SCORING.active()`` so that a prompt-logprob call takes the head path decode takes (the gate's target check
scores through it; ``radiance.lmhead_int4.patch.Int4HeadMethod``). Every TP rank runs the same bookkeeping on
the same requests, so every rank is inside the bracket for the same calls. Without int4-head nothing is
bracketed: the stock reference (``radiance gate --record-reference``, every feature off) scores stock.
"""
from __future__ import annotations

import logging
import threading

from .patching import Hooks, Patch, resolve

logger = logging.getLogger("radiance")

_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
_STATE = "vllm.v1.worker.gpu_model_runner.ExecuteModelState"
_V2_WORKER = "vllm.v1.worker.gpu.sample.prompt_logprob.PromptLogprobsWorker"
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


class ScoringHooks(Hooks):
    """V1's ``GPUModelRunner``: its prompt-logprob computation runs inside the scoring scope."""

    target = _RUNNER
    via = "_radiance_prompt_scoring"

    def _get_prompt_logprobs_dict(self, *args, **kwargs):
        if not self.num_prompt_logprobs:  # every step comes here; most have no prompt logprobs
            return self._orig__get_prompt_logprobs_dict(*args, **kwargs)
        with self._radiance_prompt_scoring:
            return self._orig__get_prompt_logprobs_dict(*args, **kwargs)


class V2ScoringHooks(Hooks):
    """V2's ``PromptLogprobsWorker``: both of its prompt-logprob computations run inside the scoring scope."""

    target = _V2_WORKER
    via = "_radiance_prompt_scoring"

    def compute_prompt_logprobs(self, *args, **kwargs):
        with self._radiance_prompt_scoring:
            return self._orig_compute_prompt_logprobs(*args, **kwargs)

    def compute_prompt_token_id_logprobs(self, *args, **kwargs):
        with self._radiance_prompt_scoring:
            return self._orig_compute_prompt_token_id_logprobs(*args, **kwargs)


class PromptScoringScope(Patch):
    """The bracket around the runner's prompt-logprob head calls (module docstring). One instance,
    ``SCORING``, listed in int4-head's ``PATCHES``; ``active()`` is per thread."""

    name = "prompt_logprobs.scoring_scope"
    feature = ""  # installed by the features that read it (int4-head), never on its own
    hook_points = (f"{_RUNNER}._get_prompt_logprobs_dict", f"{_V2_WORKER}.compute_prompt_logprobs",
                   f"{_V2_WORKER}.compute_prompt_token_id_logprobs")

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def active(self) -> bool:
        """True while the runner computes prompt logprobs (in this thread)."""
        return getattr(self._local, "depth", 0) > 0

    def __enter__(self) -> "PromptScoringScope":
        self._local.depth = getattr(self._local, "depth", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        self._local.depth -= 1

    def apply(self) -> None:
        self.hook(ScoringHooks)
        self.hook(V2ScoringHooks)


SCORING = PromptScoringScope()

PATCHES = [PromptLogprobsPatch()]  # SCORING is installed by int4-head (radiance/lmhead_int4/patch.py)
