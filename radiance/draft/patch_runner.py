"""dynamic-draft in vLLM 0.32's V1 model runner: run the MTP forwards the scheduler chose, verify k.

``GPUModelRunner.propose_draft_token_ids`` (the CPU runner is its subclass) reads the step's depth from
its ``SchedulerOutput`` (``DEPTH_ATTR``, left there by patch_scheduler.py; every TP rank receives the same
object), asks vLLM's own proposer for that many drafts, and pads each request's drafts to the configured
k by repeating its last draft token: the next step verifies k + 1 tokens as always (the hybrid layers'
state needs it; patch_scheduler.py says why), so the target's batch shapes and CUDA graphs do not change.
Draft probabilities, where the proposer returns them (probabilistic draft sampling), get one-hot rows for
the padding: the rejection sampler then accepts a padded token with exactly the target's probability of
it, as speculative sampling requires of a proposal that is certain.

Under vLLM's synthetic rejection sampler (``rejection_sample_method: synthetic``, the benchmark's stand-in for
acceptance with dummy weights) a draft is accepted by its position, never by its token, so the padding
would be accepted at its position's rate as if drafted. The step's conditional rates past the depth are
therefore zero there (``synthetic_rates``): the sampler then credits the drafts really made and rejects
the padding, as a real target all but always would. Outside synthetic mode nothing changes.

A proposer that raises at the shallower depth latches the feature off; the step is drafted again at k.
"""
from __future__ import annotations

import torch

from ..patching import Hooks

RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
VIA = "_radiance_draft"
DEPTH_ATTR = "radiance_draft_depth"      # on a SchedulerOutput: the MTP forwards the step runs


def pad_drafts(drafts, k: int):
    """Each request's drafts to width k, repeating its last token (a [B, d] tensor, or lists)."""
    if isinstance(drafts, torch.Tensor):
        d = drafts.shape[1]
        if d >= k or d == 0:
            return drafts
        return torch.cat([drafts, drafts[:, -1:].expand(-1, k - d)], dim=1)
    return [list(t) + [t[-1]] * (k - len(t)) if 0 < len(t) < k else t for t in drafts]


def pad_probs(probs: torch.Tensor, drafts: torch.Tensor, k: int) -> torch.Tensor:
    """[B, d, V] proposal probabilities to [B, k, V]: a padded position proposes its token with certainty."""
    b, d, v = probs.shape
    if d >= k:
        return probs
    onehot = torch.zeros((b, k - d, v), dtype=probs.dtype, device=probs.device)
    onehot.scatter_(2, drafts[:, d:k].to(torch.int64).unsqueeze(-1), 1.0)
    return torch.cat([probs, onehot], dim=1)


class SyntheticRates:
    """The synthetic sampler's conditional rates for each depth, from the rates vLLM (or whoever set
    ``rejection_sampler.synthetic_conditional_rates`` since) gave it: position >= depth rejects."""

    def __init__(self) -> None:
        self.base: torch.Tensor | None = None
        self.by_depth: dict[int, torch.Tensor] = {}

    def select(self, runner, depth: int) -> None:
        """Before the drafts of the step are returned: the next step's sampling verifies them."""
        sampler = getattr(runner, "rejection_sampler", None)
        current = getattr(sampler, "synthetic_conditional_rates", None)
        if current is None:  # not synthetic (or no sampler): a real target judges the padding
            return
        if current is not self.base and not any(current is t for t in self.by_depth.values()):
            # new rates from outside (engine start, or a benchmark switching profiles): rebuild the table
            self.base, self.by_depth = current, {}
        if depth not in self.by_depth:
            rates = self.base.clone()
            rates[depth:] = 0.0
            self.by_depth[depth] = rates
        # a pointer swap on the host: the step's sampling kernel, issued later on the same stream, reads it
        sampler.synthetic_conditional_rates = self.by_depth[depth]


class RunnerHooks(Hooks):
    """``GPUModelRunner`` (V1; the CPU runner is its subclass)."""

    target = RUNNER
    via = VIA

    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        k = scheduler_output.num_spec_tokens_to_schedule
        depth = getattr(scheduler_output, DEPTH_ATTR, None)
        draft = self._radiance_draft
        if depth is None or depth >= k or draft.latched_off:
            draft.synthetic.select(self, k)
            return self._orig_propose_draft_token_ids(scheduler_output, *args, **kwargs)
        try:
            scheduler_output.num_spec_tokens_to_schedule = depth
            try:
                drafts = self._orig_propose_draft_token_ids(scheduler_output, *args, **kwargs)
            finally:
                scheduler_output.num_spec_tokens_to_schedule = k
            drafts = pad_drafts(drafts, k)
            probs = getattr(self, "_draft_probs", None)
            if probs is not None:
                if not isinstance(drafts, torch.Tensor) or probs.dim() != 3 or probs.shape[1] != depth:
                    raise RuntimeError(f"draft probabilities of shape {tuple(probs.shape)} for {depth} drafts")
                self._draft_probs = pad_probs(probs, drafts, k)
            draft.synthetic.select(self, depth)
            return drafts
        except Exception as exc:
            draft.latch_off(f"drafting {depth} of {k}: {type(exc).__name__}: {exc}")
            draft.synthetic.select(self, k)
            return self._orig_propose_draft_token_ids(scheduler_output, *args, **kwargs)

