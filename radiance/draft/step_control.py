"""dynamic-draft's glue to the controller, once per decoding step (the model runner's side).

``GPUModelRunner.propose_draft_token_ids`` decides whether this step is one the controller handles
(``_step_or_reason``), brings the context mirror up to date, runs the n-gram matcher, starts a
``StepController`` and leaves it on the drafter (``STEP_ATTR``) for the proposer's hooks to find
(slot_capture.py). Once the step is drafted it credits the previous step's accepted tokens to the
telemetry and remembers what this step proposed. Steps it does not handle run stock MTP and are
reported (``partial``, or ``declined`` while no step has been controlled).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ..patching import Hooks, Outcome, report, resolve
from .context_mirror import ContextMirror
from .controller import StepController
from .lookahead import _host_wait, _HostRing

logger = logging.getLogger("radiance")

_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
_WORKER = "vllm.v1.worker.gpu_worker.Worker"

# Attribute names this patch leaves on vLLM objects (one place, so a test can clear them).
STEP_ATTR = "_radiance_draft_step"
STATE_ATTR = "_radiance_draft_state"
CREDIT_ATTR = "_radiance_draft_credit"
VIA = "_radiance_draft"  # the patch itself, on each hooked vLLM class (Hooks.via)

_PROBABILISTIC = "draft sampling is probabilistic and a request is not greedy"
_V2_REASON = ("vLLM built Model Runner V2, whose MTP proposer this patch does not hook: stock "
              "MTP. Set VLLM_USE_V2_MODEL_RUNNER=0 to use dynamic-draft")


@dataclass
class _Step:
    ctl: StepController | None   # None on a poisoned step
    k: int
    batch: int
    ragged: bool
    req_ids: list[str]
    slot: int = 0
    drafts: list[list[int]] | None = None
    poisoned: bool = False       # this rank's preparation failed: only carry the fault to the exchange
    lookahead: bool = False      # decide slot j while slot j+1's forward runs (lookahead.py)
    limit: int = 0               # forwards the step may run at most (the schedule's cap); 0: k
    pending: tuple | None = None  # (slot, host copy in flight, this rank's fault) of the slot not yet decided
    ngram: tuple | None = None   # the n-gram continuations' host copy in flight (begin deferred)

    def last_slot(self, j: int) -> bool:
        """Whether slot j's forward is the last the step can run, whatever the controller sees."""
        return j + 1 >= (self.limit or self.k)


@dataclass
class _RunnerState:
    """Per model runner: the mirror and what the previous step proposed (for acceptance)."""
    mirror: ContextMirror
    last: dict[str, tuple[int, int]] = field(default_factory=dict)  # req -> (len, tail start)


class RunnerHooks(Hooks):
    """``GPUModelRunner`` (and the CPU runner, its subclass)."""

    target = _RUNNER
    via = VIA

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, *args, **kwargs):
        draft = self._radiance_draft
        if not draft.latched_off:
            try:
                draft._prepare(self, scheduler_output, sampled_token_ids, sampling_metadata)
            except Exception as exc:
                setattr(self.drafter, STEP_ATTR, None)
                draft.fault(f"step preparation: {type(exc).__name__}: {exc}")
                draft._poison_step(self, scheduler_output, sampling_metadata)
        try:
            return self._orig_propose_draft_token_ids(scheduler_output, sampled_token_ids, sampling_metadata,
                                                      *args, **kwargs)
        finally:
            step = getattr(self.drafter, STEP_ATTR, None)
            setattr(self.drafter, STEP_ATTR, None)
            try:  # the previous step's acceptance, before this step's drafts replace it
                draft._settle_credit(self)
            except Exception as exc:
                draft.fault(f"step accounting: {type(exc).__name__}: {exc}")
            if step is not None and step.drafts is not None and not draft.latched_off:
                try:
                    draft._after_step(self, step)
                except Exception as exc:
                    draft.fault(f"step accounting: {type(exc).__name__}: {exc}")


class WorkerHooks(Hooks):
    """``Worker``: only to say so when vLLM builds a runner this patch does not hook (V2)."""

    target = _WORKER
    via = VIA

    def _make_model_runner(self, *args, **kwargs):
        made = self._orig__make_model_runner(*args, **kwargs)
        draft = self._radiance_draft
        try:
            v1 = resolve(_RUNNER)[2]
            if not isinstance(made, v1) and not draft.latched_off:
                draft.latch_off(_V2_REASON)
        except Exception:  # only a diagnostic: never in the way of building the runner
            pass
        return made


class StepControl:
    """The patch's side of a step: whether the controller runs it, its preparation, its accounting."""

    @staticmethod
    def _step_or_reason(runner, sampling_metadata, k: int) -> str | None:
        """None when the controller can run this step, else why not (stock MTP this step).
        Attributes that are missing count as 'unsupported', never as 'fine'."""
        from vllm.v1.spec_decode.eagle import EagleProposer

        spec = getattr(runner, "speculative_config", None)
        drafter = getattr(runner, "drafter", None)
        if spec is None or getattr(spec, "method", None) != "mtp" \
                or type(drafter) is not EagleProposer:
            return "the drafter is not plain MTP"
        if getattr(drafter, "parallel_drafting", True) \
                or getattr(drafter, "use_heterogeneous_vocab", True):
            return "parallel drafting or a heterogeneous vocabulary is on"
        if getattr(drafter, "use_local_argmax_reduction", True):
            return "vLLM's local-argmax draft path is on (it yields no confidence)"
        if getattr(drafter, "_enable_probabilistic_draft_probs", True) \
                and not getattr(sampling_metadata, "all_greedy", False):
            return _PROBABILISTIC
        if k < 2:
            return "fewer than two draft slots are scheduled"
        if getattr(runner, "use_async_scheduling", True):
            return "vLLM schedules asynchronously"  # said in full at load (after_load)
        return None

    def _decline_step(self, reason: str) -> None:
        n = self.steps_declined.get(reason, 0)
        self.steps_declined[reason] = n + 1
        if n == 0:
            logger.info("radiance: dynamic-draft runs stock MTP for steps where %s", reason)
            self._report_steps()
        if self.counters is not None:
            self.counters.add(fallback_steps=1)

    def _report_steps(self) -> None:
        """The outcome once steps run stock: ``partial`` (the controller drafted some steps) or ``declined``
        (none yet), with the reasons seen; the counts travel as counters (``steps`` against
        ``fallback_steps``) and the status reader puts them beside it. Said only when a reason is new or
        the first controlled step follows stock ones, never per step. Every rank decides the same steps
        alike, so TP rank 0 says it for every rank."""
        if self.latched_off or self.declined_at_load or not self.steps_declined:
            return
        status = "partial" if self.steps_seen else "declined"
        reason = "stock MTP for steps where " + "; ".join(self.steps_declined)
        report().record(Outcome(self.name, self.feature, status, reason))
        tp, rank = self._tp()
        if tp > 1 and rank == 0:
            from ..report import channel

            for r in range(1, tp):
                channel.update_row(str(r), {"patch": self.name, "feature": self.feature, "status": status,
                                            "reason": reason})

    @staticmethod
    def _state(runner) -> _RunnerState:
        st = getattr(runner, STATE_ATTR, None)
        if st is None:
            rows, width = runner.input_batch.token_ids_cpu.shape
            st = _RunnerState(ContextMirror(rows, width, runner.device))
            setattr(runner, STATE_ATTR, st)
        return st

    def _prepare(self, runner, scheduler_output, sampled_token_ids, sampling_metadata) -> None:
        """Mirror + matcher + a fresh StepController on the drafter (or nothing: stock step).
        Nothing here waits for the device: this step's sampled tokens go into the mirror on the
        device, and their host copy (the previous step's acceptance, for the counters) is read
        once the step is drafted."""
        drafter = runner.drafter
        setattr(drafter, STEP_ATTR, None)
        k = int(scheduler_output.num_spec_tokens_to_schedule)
        ib = runner.input_batch
        req_ids = list(ib.req_ids)
        b = len(req_ids)
        # This step's sampled tokens: on the device, -1 where rejected, before vLLM's
        # bookkeeping (padded drafter batch, the default); a list after it.
        sampled = sampled_token_ids[:b] if torch.is_tensor(sampled_token_ids) else None
        if sampled is not None:
            # Copied (and waited for after the step) only when a controlled step's drafts are owed their
            # acceptance: a stream of stock steps (declined ones: async scheduling) must not wait on the
            # device each step.
            if self._credit_owed(runner):
                setattr(runner, CREDIT_ATTR,
                        (req_ids, self._ring.copy(_HostRing.CREDIT, sampled.to(torch.int32))))
        else:
            self._credit_acceptance(runner, req_ids, [list(t) for t in sampled_token_ids[:b]])
        if not b:
            return  # nothing to draft: neither a controlled step nor a stock one
        reason = self._step_or_reason(runner, sampling_metadata, k)
        if reason is not None:
            self._decline_step(reason)
            return
        state = self._state(runner)
        discard = runner.discard_request_mask.np[:b] if sampled is not None else None  # chunked prefill
        counts = np.asarray(ib.num_tokens_no_spec[:b], dtype=np.int64)
        n_dev = state.mirror.update(req_ids, ib.token_ids_cpu, counts, sampled=sampled, discard=discard)
        from ..kernels.ngram_match import ngram_match

        cont, clen = ngram_match(state.mirror.rows(b), n_dev, k, self.policy.ngram)
        # Ragged drafts (fewer tokens to verify too) only where vLLM takes them: not under async
        # scheduling (it reads drafts as a [B, k] tensor) and not for hybrid models, whose
        # linear-attention spec path assumes k drafts per request (vLLM 0.32's CPU GDN kernel
        # fails on ragged ones). Qwen3-Next is hybrid: full width, only forwards are saved.
        ragged = not runner.use_async_scheduling and not runner.model_config.is_hybrid
        self.start_step(drafter, k, ragged, req_ids, torch.cat([cont, clen[:, None]], dim=1))

    def start_step(self, drafter, k: int, ragged: bool, req_ids: list[str], ngram: torch.Tensor) -> _Step:
        """Leave a StepController for ``propose`` on ``drafter``. ``ngram`` is [B, k+1] on the
        device: each request's n-gram continuation, then its length. With look-ahead its host copy
        is read at the first decision, when two forwards are already queued behind it."""
        b = len(req_ids)
        cap = self.policy.forward_cap(b)
        step = _Step(StepController(self.policy), k, b, ragged, req_ids,
                     lookahead=self._lookahead_for(ngram), limit=k if cap is None else min(k, cap))
        copy = self._ring.copy(_HostRing.NGRAM, ngram.to(torch.int32))
        if step.lookahead:
            step.ngram = copy
        else:
            both = _host_wait(copy)
            step.ctl.begin(k, both[:, :k].tolist(), both[:, k].tolist())
        self.steps_seen += 1
        if self.steps_seen == 1 and self.steps_declined:  # stock steps came first: now partial
            self._report_steps()
        setattr(drafter, STEP_ATTR, step)
        return step

    def _after_step(self, runner, step: _Step) -> None:
        ctl = step.ctl
        if self.counters is not None and self._records():
            self.counters.record_step(ctl, step.k)
        state = getattr(runner, STATE_ATTR, None)
        if state is not None:
            tails = ctl.ngram_tokens()
            state.last = {rid: (len(d), len(d) - tails[i] if tails[i] else len(d))
                          for i, (rid, d) in enumerate(zip(step.req_ids, step.drafts))}

    def _settle_credit(self, runner) -> None:
        pending = getattr(runner, CREDIT_ATTR, None)
        if pending is None:
            return
        setattr(runner, CREDIT_ATTR, None)
        req_ids, copy = pending
        self._credit_acceptance(runner, req_ids, [[int(t) for t in row if t >= 0] for row in _host_wait(copy)])

    def _credit_owed(self, runner) -> bool:
        state = getattr(runner, STATE_ATTR, None)
        return state is not None and self.counters is not None and bool(state.last)

    def _credit_acceptance(self, runner, req_ids, valid) -> None:
        """The previous step's drafts met the target: count accepted tokens (all, n-gram)."""
        if not self._credit_owed(runner):
            return
        last = getattr(runner, STATE_ATTR).last
        total = ngram = 0
        for rid, toks in zip(req_ids, valid):
            prev = last.get(rid)
            if prev is None:
                continue
            length, tail_start = prev
            a = min(max(0, len(toks) - 1), length)  # the last valid token is the target's own
            total += a
            ngram += max(0, a - tail_start)
        last.clear()
        if self._records():
            self.counters.add(draft_tokens_accepted=total, ngram_tokens_accepted=ngram)
