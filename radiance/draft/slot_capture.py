"""dynamic-draft inside the MTP proposer: per draft slot, the capture and the decision; the loop-break.

``SpecDecodeBaseProposer._sample_draft_tokens`` runs once after every MTP forward (slot 0 after the
first pass, then once per iteration of ``propose``'s drafting loop). It computes the greedy token and
its top-1 confidence in one capture (``local_vocab``: the same token ``argmax`` gives, plus
``1/sum-exp``), copies token and confidence to the host in one transfer, and lets the controller decide
(at once, or during the next slot's forward: lookahead.py). Once no request drafts any more it raises
``_StopDrafting``: the loop-break.

``SpecDecodeBaseProposer.propose`` catches ``_StopDrafting`` (the remaining forwards of the loop never
run) and returns the controller's drafts: ragged lists where the runner takes them (synchronous
scheduling and a model without linear attention: fewer tokens to verify too), else a full-width tensor
(async scheduling reads drafts as a [B, k] tensor, and hybrid models such as Qwen3-Next verify exactly
k per request); positions past a request's draft then hold the MTP tokens the batch drafted anyway,
then a copy of its last token, which the target verifies like any other guess: only forwards are saved
there.

Why the loop-break is safe: ``_StopDrafting`` leaves ``propose`` right after a sampling call, which is
exactly where stock ``propose`` with ``num_speculative_tokens = forwards run`` would have finished its
loop; the only state the loop mutates is the drafter's own scratch (positions, slot mapping, its
attention metadata) that the next step rebuilds.
"""
from __future__ import annotations

import torch

from ..kernels.draft_confidence import draft_top1
from ..patching import Hooks
from .lookahead import _HostRing
from .step_control import STEP_ATTR, VIA, _Step

_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer"


class _StopDrafting(BaseException):
    """Raised from the per-slot hook once no request drafts: ends ``propose``'s loop.

    A BaseException so that nothing between the raise and our ``propose`` (vLLM code, the
    ``fail_closed`` wrappers) mistakes it for a failure."""


class ProposerHooks(Hooks):
    """``SpecDecodeBaseProposer`` (vLLM's MTP drafter is an ``EagleProposer``, its subclass)."""

    target = _PROPOSER
    via = VIA

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        draft = self._radiance_draft
        stock = self._orig__sample_draft_tokens
        step: _Step | None = getattr(self, STEP_ATTR, None)
        if step is None or draft.latched_off:
            return stock(hidden_states, sampling_metadata)
        if step.pending is not None:
            # the previous slot, decided now that this slot's forward is queued behind it
            verdict = draft._settle(step)
            if verdict == "latched":  # every rank, this slot: stock from here on
                return stock(hidden_states, sampling_metadata)
            if verdict == "done":  # this slot's forward ran ahead: dropped
                raise _StopDrafting
        tp = draft._tp()[0]
        lookahead = step.lookahead and not step.last_slot(step.slot)
        if tp == 1:
            try:
                token, row = draft._top1(self, hidden_states)
            except Exception as exc:
                # stock sampling for this slot and the rest of the step: propose sees the
                # latch and returns stock's own draft
                draft.latch_off(f"draft slot: {type(exc).__name__}: {exc}")
                return stock(hidden_states, sampling_metadata)
            local_reason = None
        else:
            token, conf, flags, local_reason, faulted = draft._top1_collective(
                self, hidden_states, step, defer=lookahead)
            if faulted:  # known now: every rank, this slot, stock from here on
                draft._agreed_latch(faulted, local_reason)
                return stock(hidden_states, sampling_metadata)
        try:
            if token.shape[0] != step.batch:
                raise RuntimeError(f"draft batch {token.shape[0]} != {step.batch} requests")
            if tp > 1:  # the host row: token ids, confidence bits, the ranks' fault flags
                parts = [token.to(torch.int32), conf.float().view(torch.int32)]
                if flags is not None:
                    parts.append(flags.to(torch.int32))
                row = torch.cat(parts)
            copy = draft._ring.copy(_HostRing.SLOT + step.slot, row)  # the one per-slot copy
            step.pending = (step.slot, copy, local_reason)
            step.slot += 1
            if not lookahead:
                verdict = draft._settle(step)
                if verdict == "latched":
                    return stock(hidden_states, sampling_metadata)
                if verdict == "done":
                    raise _StopDrafting
        except _StopDrafting:
            raise
        except Exception as exc:
            draft._fault_after_exchange(exc, tp)
            return stock(hidden_states, sampling_metadata)
        return token, None

    def propose(self, num_speculative_tokens, *args, **kwargs):
        draft = self._radiance_draft
        step: _Step | None = getattr(self, STEP_ATTR, None)
        if step is None or draft.latched_off:
            return self._orig_propose(num_speculative_tokens, *args, **kwargs)
        if num_speculative_tokens != step.k:
            setattr(self, STEP_ATTR, None)
            return self._orig_propose(num_speculative_tokens, *args, **kwargs)
        try:
            out = self._orig_propose(num_speculative_tokens, *args, **kwargs)
        except _StopDrafting:
            out = None
        if out is not None and step.pending is not None and not draft.latched_off:
            try:  # the loop ended on a slot still undecided (it always decides its last one)
                draft._settle(step)
            except Exception as exc:
                draft._fault_after_exchange(exc, draft._tp()[0])
        if out is not None and (draft.latched_off or step.ctl is None or not step.ctl.done):
            setattr(self, STEP_ATTR, None)  # a hook fell back: stock's draft stands
            return out
        try:
            step.drafts = step.ctl.drafts()
            if step.ragged:
                return step.drafts
            return _full_width(step.drafts, step, self.device)
        except Exception as exc:
            # the loop already broke: the MTP tokens drafted so far are a valid draft (the same
            # on every rank); the fault is carried to every rank at the next exchange
            draft.fault(f"draft assembly: {type(exc).__name__}: {exc}")
            step.drafts = None
            mtp = torch.tensor(list(zip(*step.ctl.mtp)), dtype=torch.int64, device=self.device)
            return mtp if step.ragged else _pad_width(mtp, step.k)


class SlotCapture:
    """The patch's side of a slot at TP=1 (TP>1: tp_exchange.py)."""

    def _top1(self, proposer, hidden_states) -> tuple[torch.Tensor, torch.Tensor]:
        """TP=1: the stock greedy token (argmax of the draft logits, lowest id on ties) and the
        slot's host row (the tokens, then their probabilities' bits), both from one launch: the
        host's per-slot work is that launch and one copy."""
        logits = proposer.model.compute_logits(hidden_states)
        return draft_top1(logits, logits.shape[-1])


def _full_width(drafts, step: _Step, device) -> torch.Tensor:
    """[B, k] for the runner paths that read drafts as a tensor (async scheduling): each row is
    its draft, then the MTP tokens the batch drafted past it, then a repeat of its last token.
    All are guesses the target verifies like any other; wrong ones are rejected."""
    k = step.k
    mtp = list(zip(*step.ctl.mtp))
    rows = []
    for i, d in enumerate(drafts):
        row = list(d[:k])
        row.extend(mtp[i][len(row):k])
        row.extend([row[-1]] * (k - len(row)))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64, device=device)


def _pad_width(t: torch.Tensor, k: int) -> torch.Tensor:
    if t.shape[1] >= k:
        return t[:, :k]
    return torch.cat([t, t[:, -1:].expand(-1, k - t.shape[1])], dim=1)
