"""dynamic-draft inside vLLM 0.32's MTP proposer (model runner V1: the GPU runner and the CPU one).

Where the controller sits, per decoding step:

``GPUModelRunner.propose_draft_token_ids`` (wrapped)
    decides whether this step is one the controller handles (see ``_step_or_reason``), brings
    the context mirror up to date, runs the n-gram matcher, starts a ``StepController`` and
    leaves it on the drafter for the proposer to find. Also credits the previous step's
    accepted tokens to the telemetry.
``SpecDecodeBaseProposer._sample_draft_tokens`` (wrapped)
    runs once after every MTP forward (slot 0 after the first pass, then once per iteration of
    ``propose``'s drafting loop). It computes the greedy token and its top-1 confidence in one
    capture (``local_vocab``: the same token ``argmax`` gives, plus ``1/sum-exp``), copies
    token and confidence to the host in one transfer, and lets the controller decide. Once no
    request drafts any more it raises ``_StopDrafting``: the loop-break.

    Look-ahead (GPU tensors; ``RADIANCE_DRAFT_LOOKAHEAD``): the copy goes to pinned memory
    without waiting and the token goes back to vLLM's loop at once, so the next slot's forward is
    queued before the host needs this slot's verdict; the verdict is read in the next call, when
    the device is busy with that forward. A stop there drops the forward that ran ahead (one that
    stock MTP would have run anyway); the drafts are the ones decided without look-ahead. The
    slot that is the step's last whatever the controller sees (k, or the schedule's cap) is
    decided at once: nothing runs past it. The step's n-gram continuations are read the same
    way (``begin`` waits for the first decision), and the step's sampled tokens go into the
    context mirror on the device (their host copy, for the acceptance counters, is read once the
    step is drafted). Off on CPU, where every copy is synchronous and nothing would overlap.
``SpecDecodeBaseProposer.propose`` (wrapped)
    catches ``_StopDrafting`` (the remaining forwards of the loop never run) and returns the
    controller's drafts: ragged lists where the runner takes them (synchronous scheduling and
    a model without linear attention: fewer tokens to verify too), else a full-width tensor
    (async scheduling reads drafts as a [B, k] tensor, and hybrid models such as Qwen3-Next
    verify exactly k per request); positions past a request's draft then hold the MTP tokens
    the batch drafted anyway, then a copy of its last token, which the target verifies like any
    other guess: only forwards are saved there).

Why the loop-break is safe: ``_StopDrafting`` leaves ``propose`` right after a sampling call,
which is exactly where stock ``propose`` with ``num_speculative_tokens = forwards run`` would
have finished its loop; the only state the loop mutates is the drafter's own scratch
(positions, slot mapping, its attention metadata) that the next step rebuilds.

Lossless: the verified tokens are still checked by the unchanged rejection sampler; the
controller changes only how many tokens are proposed, and where (MTP or n-gram) they come from.

Fail closed:
* declined at install (stock MTP, one log line): hook points missing, vLLM outside the pinned
  range, Model Runner V2 selected (it has its own proposer, which this patch does not hook);
* per step, stock MTP for that step: a drafter that is not plain MTP (``EagleProposer`` with
  method "mtp"), parallel drafting, vLLM's local-argmax or heterogeneous-vocab draft paths,
  probabilistic draft sampling with a non-greedy request in the batch, k < 2; the feature's status then
  says ``partial`` (``declined`` while no step has been controlled), and ``radiance status`` puts the
  step counts beside it; what the load decides for every step (no drafter, one that is not MTP, one
  slot) is reported declined at load (``after_load``);
* any exception in the hooks latches the patch off (``Patch.latch_off``, the semantics of
  ``fail_closed``, written out so that vLLM's own exceptions are never retried and the loop-break is
  never mistaken for a failure): stock MTP from then on, one warning.

One truth across ranks (TP > 1): every rank runs the same controller on the same gathered numbers,
so the ranks stay in lockstep -- the same forwards, the same collectives -- as long as no rank acts
alone. A rank that faults therefore does not fall back by itself (its peers would break the loop
where it does not, and the collectives would diverge: a hang). It marks the fault pending and keeps
following the protocol, and at the next draft slot its share of the slot's exchange -- the per-row
stats all-gather of the local-vocabulary path, or a one-flag all-gather before the gathered-logits
path -- carries NaN: every rank sees which rank faulted, in the same slot of the same step, and
every rank latches off there and runs that slot and the rest of the step as stock MTP (with
look-ahead the slot's per-rank fault flags travel in its host copy: every rank learns of the fault
when that slot is decided, during the next, and latches there; the faulted slot's token is a valid
id, and verified like any other). A fault
after the exchange (the host copy, the controller) cannot be agreed on any more within the step:
at TP > 1 it is raised, the engine stops loudly and the gateway goes unready -- never a split.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import envs
from ..kernels.draft_confidence import draft_top1
from ..patching import Outcome, Patch, report, resolve
from .context_mirror import ContextMirror
from .controller import DraftPolicy, StepController
from .local_vocab import check_vocab, combine, sample_top1, shard_stats
from .telemetry import DraftCounters

logger = logging.getLogger("radiance")

_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer"
_RUNNER = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"

# Attribute names this patch leaves on vLLM objects (one place, so a test can clear them).
STEP_ATTR = "_radiance_draft_step"
STATE_ATTR = "_radiance_draft_state"
CREDIT_ATTR = "_radiance_draft_credit"


class _StopDrafting(BaseException):
    """Raised from the per-slot hook once no request drafts: ends ``propose``'s loop.

    A BaseException so that nothing between the raise and our ``propose`` (vLLM code, the
    ``fail_closed`` wrappers) mistakes it for a failure."""


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
    lookahead: bool = False      # decide slot j while slot j+1's forward runs (module doc)
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


class _HostRing:
    """Pinned host rows and CUDA events, allocated once and reused every step: a device->host copy
    then costs the copy and an event record, no allocation (the pinned allocator and event creation
    cost more host time than the copy). Row ``NGRAM`` holds the step's n-gram continuations, ``CREDIT``
    its sampled tokens, ``SLOT + j`` draft slot j; each row is read (after its event) before the next
    copy into it is issued. Every copy is int32 (token ids, confidences' bits, flags); a CPU tensor
    takes a plain copy."""

    NGRAM, CREDIT, SLOT = 0, 1, 2

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.events: list = []
        self.views: dict[tuple, torch.Tensor] = {}  # (row, shape) -> its host view (a view costs µs too)

    def copy(self, row: int, t: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        if not t.is_cuda:
            return t.to("cpu", copy=True), None
        assert t.dtype == torch.int32, t.dtype
        host = self.views.get((row, t.shape))
        if host is None:
            n = t.numel()
            if self.buf is None or self.buf.shape[0] <= row or self.buf.shape[1] < n:
                rows = max(row + 1, 0 if self.buf is None else self.buf.shape[0], self.SLOT + 8)
                width = max(n, 0 if self.buf is None else self.buf.shape[1], 256)
                self.buf = torch.empty((rows, width), dtype=torch.int32, pin_memory=True)
                self.events = [torch.cuda.Event() for _ in range(rows)]
                self.views.clear()
            host = self.views[(row, t.shape)] = self.buf[row, :n].view(t.shape)
        host.copy_(t, non_blocking=True)
        event = self.events[row]
        event.record()
        return host, event


def _host_wait(copy: tuple) -> np.ndarray:
    host, event = copy
    if event is not None:
        event.synchronize()
    return host.numpy()


def _vllm_config_v2() -> bool | None:
    try:
        from vllm.config import get_current_vllm_config

        cfg = get_current_vllm_config()
        return bool(cfg.use_v2_model_runner) if cfg is not None and cfg.model_config else None
    except Exception:
        return None


class DynamicDraftPatch(Patch):
    name = "dynamic_draft.proposer"
    feature = "dynamic_draft"
    hook_points = (
        f"{_PROPOSER}.propose",
        f"{_PROPOSER}._sample_draft_tokens",
        f"{_RUNNER}.propose_draft_token_ids",
        "vllm.v1.spec_decode.eagle.EagleProposer",
        "vllm.distributed.tensor_model_parallel_all_gather",
        "vllm.distributed.get_tensor_model_parallel_world_size",
        "vllm.distributed.get_tensor_model_parallel_rank",
    )
    # Wrapped only to say so when vLLM builds a runner this patch does not hook (V2).
    optional_hook = "vllm.v1.worker.gpu_worker.Worker._make_model_runner"

    def __init__(self) -> None:
        super().__init__()
        self.policy: DraftPolicy | None = None
        self.local_vocab = True  # RADIANCE_DRAFT_LOCAL_VOCAB, read at install
        self.lookahead = "auto"  # RADIANCE_DRAFT_LOOKAHEAD, read at install
        self._lookahead_said = False
        self._ring = _HostRing()
        self.fault_pending: str | None = None  # TP > 1: a local fault not yet agreed with the peers
        self.steps_seen = 0  # controlled steps started in this process (names the step of a latch)
        self.counters: DraftCounters | None = None
        self.steps_declined: dict[str, int] = {}
        self.declined_at_load = False  # after_load said the loaded drafter runs stock every step
        self.slots_observed = 0  # per-slot hook calls that reached the controller (tests)

    def guard(self) -> str | None:
        try:
            self.policy = DraftPolicy.from_env()
            self.local_vocab = envs.get("RADIANCE_DRAFT_LOCAL_VOCAB")
            self.lookahead = envs.get("RADIANCE_DRAFT_LOOKAHEAD")
        except envs.KnobError as exc:  # a bad knob is a startup error, said once and clearly
            return str(exc)
        if _vllm_config_v2():
            return _V2_REASON
        return None

    def apply(self) -> None:
        from ..report import channel

        self.counters = DraftCounters()
        channel.add_counter_source(self.counters.take_deltas)
        owner, _, orig_propose = resolve(f"{_PROPOSER}.propose")
        _, _, orig_sample = resolve(f"{_PROPOSER}._sample_draft_tokens")
        runner, _, orig_runner = resolve(f"{_RUNNER}.propose_draft_token_ids")
        self.replace(owner, "propose", self._make_propose(orig_propose))
        self.replace(owner, "_sample_draft_tokens", self._make_sample(orig_sample))
        self.replace(runner, "propose_draft_token_ids", self._make_runner(orig_runner))
        try:
            worker, _, orig_make = resolve(self.optional_hook)
        except LookupError:
            return
        self.replace(worker, "_make_model_runner", self._make_runner_factory(orig_make))

    def latch_off(self, reason: str) -> None:
        super().latch_off(reason)
        if self.counters is not None:
            self.counters.add(fallback_steps=1)

    @staticmethod
    def _tp() -> tuple[int, int]:
        try:
            from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

            return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        except Exception:
            return 1, 0

    def fault(self, reason: str) -> None:
        """A fault on this rank: at TP=1 latch off now; at TP>1 keep it pending until the next draft
        slot's exchange carries it to every rank (see the module doc)."""
        tp, rank = self._tp()
        if tp == 1:
            self.latch_off(reason)
        elif self.fault_pending is None:
            self.fault_pending = reason
            logger.warning("radiance: dynamic-draft fault on TP rank %d (%s); every rank turns it off together "
                           "at the next draft slot", rank, reason)

    def _agreed_latch(self, faulted: list[int], local_reason: str | None) -> None:
        """Every rank, same slot: the gathered exchange said which ranks faulted."""
        _, rank = self._tp()
        mine = self.fault_pending or local_reason
        where = f"step {self.steps_seen}"
        if rank in faulted and mine:
            reason = f"fault on TP rank {rank} at {where}: {mine}"
        else:
            reason = f"TP rank(s) {', '.join(map(str, faulted))} faulted at {where}; turned off on every rank together"
        self.fault_pending = None
        self.latch_off(reason)
        tp, _ = self._tp()
        if rank == 0:  # rank 0 speaks for every rank on the report channel
            from ..report import channel

            for r in range(tp):
                if r == 0:
                    continue
                why = (f"fault on TP rank {r} at {where} (its log has the error); turned off on every rank together"
                       if r in faulted else f"TP rank(s) {', '.join(map(str, faulted))} faulted at {where}; "
                                            "turned off on every rank together")
                channel.update_row(str(r), {"patch": self.name, "feature": self.feature,
                                            "status": "failed-at-runtime", "reason": why})

    def _make_runner_factory(self, orig):
        patch = self

        def _make_model_runner(self, *args, **kwargs):
            made = orig(self, *args, **kwargs)
            try:
                v1 = resolve(_RUNNER)[2]
                if not isinstance(made, v1) and not patch.latched_off:
                    patch.latch_off(_V2_REASON)
            except Exception:  # only a diagnostic: never in the way of building the runner
                pass
            return made

        return _make_model_runner

    # -- the runner: per-step preparation -----------------------------------------------
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
        return None

    def _decline_step(self, reason: str) -> None:
        n = self.steps_declined.get(reason, 0)
        self.steps_declined[reason] = n + 1
        if n == 0:
            logger.info("radiance: dynamic-draft runs stock MTP for steps where %s", reason)
            self._report_steps()
        if self.counters is not None:
            self.counters.add(fallback_steps=1)

    def after_load(self, runner) -> str | None:
        """What was loaded decides every step alike: no drafter, a drafter that is not MTP, one slot."""
        spec = getattr(runner, "speculative_config", None)
        method = getattr(spec, "method", None)
        k = getattr(spec, "num_speculative_tokens", None)
        if spec is None:
            why = "no drafter: vLLM decodes without speculative tokens"
        elif method != "mtp":
            why = f"the drafter is {method}, not MTP: it drafts as stock"
        elif isinstance(k, int) and k < 2:
            why = f"num_speculative_tokens is {k}: no draft depth to control, stock MTP"
        else:
            return None
        self.declined_at_load = True  # every step declines alike: the steps add nothing to say
        return why

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
            setattr(runner, CREDIT_ATTR, (req_ids, self._ring.copy(_HostRing.CREDIT, sampled.to(torch.int32))))
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

    def _lookahead_for(self, t: torch.Tensor) -> bool:
        on = t.is_cuda if self.lookahead == "auto" else self.lookahead == "1"
        if not self._lookahead_said:
            self._lookahead_said = True
            if on:
                logger.info("radiance: dynamic-draft decides each draft slot while the next forward runs "
                            "(look-ahead; a stop drops the slot that ran ahead)")
            else:
                why = ("RADIANCE_DRAFT_LOOKAHEAD=0" if self.lookahead == "0" else
                       "CPU tensors are copied synchronously, there is no forward to overlap")
                logger.info("radiance: dynamic-draft look-ahead off (%s): each slot is decided before "
                            "the next forward", why)
        return on

    def _begin_now(self, step: _Step) -> None:
        """The deferred ``begin``: the n-gram continuations' copy has long arrived."""
        if step.ngram is not None:
            both = _host_wait(step.ngram)
            step.ngram = None
            step.ctl.begin(step.k, both[:, :step.k].tolist(), both[:, step.k].tolist())

    def _settle_credit(self, runner) -> None:
        pending = getattr(runner, CREDIT_ATTR, None)
        if pending is None:
            return
        setattr(runner, CREDIT_ATTR, None)
        req_ids, copy = pending
        self._credit_acceptance(runner, req_ids, [[int(t) for t in row if t >= 0] for row in _host_wait(copy)])

    def _credit_acceptance(self, runner, req_ids, valid) -> None:
        """The previous step's drafts met the target: count accepted tokens (all, n-gram)."""
        state = getattr(runner, STATE_ATTR, None)
        if state is None or self.counters is None or not state.last:
            return
        last = state.last
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

    def _make_runner(self, orig):
        patch = self

        @functools.wraps(orig)
        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                    *args, **kwargs):
            if not patch.latched_off:
                try:
                    patch._prepare(self, scheduler_output, sampled_token_ids, sampling_metadata)
                except Exception as exc:
                    setattr(self.drafter, STEP_ATTR, None)
                    patch.fault(f"step preparation: {type(exc).__name__}: {exc}")
                    patch._poison_step(self, scheduler_output, sampling_metadata)
            try:
                return orig(self, scheduler_output, sampled_token_ids, sampling_metadata,
                            *args, **kwargs)
            finally:
                step = getattr(self.drafter, STEP_ATTR, None)
                setattr(self.drafter, STEP_ATTR, None)
                try:  # the previous step's acceptance, before this step's drafts replace it
                    patch._settle_credit(self)
                except Exception as exc:
                    patch.fault(f"step accounting: {type(exc).__name__}: {exc}")
                if step is not None and step.drafts is not None and not patch.latched_off:
                    try:
                        patch._after_step(self, step)
                    except Exception as exc:
                        patch.fault(f"step accounting: {type(exc).__name__}: {exc}")

        return propose_draft_token_ids

    def _poison_step(self, runner, scheduler_output, sampling_metadata) -> None:
        """TP > 1, this rank's preparation failed: join the step's first exchange with NaN so that
        every rank latches off there, instead of running stock MTP alone (see the module doc)."""
        if self._tp()[0] == 1 or self.fault_pending is None:
            return
        drafter = runner.drafter
        k = int(scheduler_output.num_spec_tokens_to_schedule)
        b = len(runner.input_batch.req_ids)
        # Exactly the steps the peers control reach an exchange: the same decision as _prepare's.
        if b and self._step_or_reason(runner, sampling_metadata, k) is None:
            setattr(drafter, STEP_ATTR, _Step(None, k, b, False, [], poisoned=True))

    def _after_step(self, runner, step: _Step) -> None:
        ctl = step.ctl
        if self.counters is not None and self._records():
            self.counters.record_step(ctl, step.k)
        state = getattr(runner, STATE_ATTR, None)
        if state is not None:
            tails = ctl.ngram_tokens()
            state.last = {rid: (len(d), len(d) - tails[i] if tails[i] else len(d))
                          for i, (rid, d) in enumerate(zip(step.req_ids, step.drafts))}

    @staticmethod
    def _records() -> bool:
        """Only TP rank 0 counts: every rank runs the same controller."""
        try:
            from vllm.distributed import get_tensor_model_parallel_rank

            return get_tensor_model_parallel_rank() == 0
        except Exception:
            return True

    # -- the proposer: per slot, and the loop-break ---------------------------------------
    def _make_sample(self, orig):
        patch = self

        @functools.wraps(orig)
        def _sample_draft_tokens(self, hidden_states, sampling_metadata):
            step: _Step | None = getattr(self, STEP_ATTR, None)
            if step is None or patch.latched_off:
                return orig(self, hidden_states, sampling_metadata)
            if step.pending is not None:
                # the previous slot, decided now that this slot's forward is queued behind it
                verdict = patch._settle(step)
                if verdict == "latched":  # every rank, this slot: stock from here on
                    return orig(self, hidden_states, sampling_metadata)
                if verdict == "done":  # this slot's forward ran ahead: dropped
                    raise _StopDrafting
            tp = patch._tp()[0]
            lookahead = step.lookahead and not step.last_slot(step.slot)
            if tp == 1:
                try:
                    token, row = patch._top1(self, hidden_states)
                except Exception as exc:
                    # stock sampling for this slot and the rest of the step: propose sees the
                    # latch and returns stock's own draft
                    patch.latch_off(f"draft slot: {type(exc).__name__}: {exc}")
                    return orig(self, hidden_states, sampling_metadata)
                local_reason = None
            else:
                token, conf, flags, local_reason, faulted = patch._top1_collective(
                    self, hidden_states, step, defer=lookahead)
                if faulted:  # known now: every rank, this slot, stock from here on
                    patch._agreed_latch(faulted, local_reason)
                    return orig(self, hidden_states, sampling_metadata)
            try:
                if token.shape[0] != step.batch:
                    raise RuntimeError(f"draft batch {token.shape[0]} != {step.batch} requests")
                if tp > 1:  # the host row: token ids, confidence bits, the ranks' fault flags
                    parts = [token.to(torch.int32), conf.float().view(torch.int32)]
                    if flags is not None:
                        parts.append(flags.to(torch.int32))
                    row = torch.cat(parts)
                copy = patch._ring.copy(_HostRing.SLOT + step.slot, row)  # the one per-slot copy
                step.pending = (step.slot, copy, local_reason)
                step.slot += 1
                if not lookahead:
                    verdict = patch._settle(step)
                    if verdict == "latched":
                        return orig(self, hidden_states, sampling_metadata)
                    if verdict == "done":
                        raise _StopDrafting
            except _StopDrafting:
                raise
            except Exception as exc:
                patch._fault_after_exchange(exc, tp)
                return orig(self, hidden_states, sampling_metadata)
            return token, None

        return _sample_draft_tokens

    def _fault_after_exchange(self, exc: Exception, tp: int) -> None:
        """A fault past the slot's TP exchange: at TP > 1 the ranks can no longer agree within the
        step, so it is raised (module doc); at TP = 1 the feature latches off here."""
        if tp > 1:
            raise RuntimeError(f"radiance dynamic-draft: fault after the TP exchange, on one rank "
                               f"({type(exc).__name__}: {exc}); stopping rather than splitting the ranks") from exc
        self.latch_off(f"draft slot: {type(exc).__name__}: {exc}")

    def _settle(self, step: _Step) -> str:
        """Decide the pending slot from its host copy: "done" (no request drafts any more),
        "drafting", or "latched" (TP>1: the slot's exchange said a rank faulted; every rank latches
        here). A failure here is after the exchange: it raises (the caller says how)."""
        j, copy, local_reason = step.pending
        step.pending = None
        host = _host_wait(copy)
        b = step.batch
        if host.shape[0] > 2 * b:  # TP>1, look-ahead: the faulted ranks came with the slot
            faulted = [r for r, f in enumerate(host[2 * b:].tolist()) if f]
            if faulted:
                self._agreed_latch(faulted, local_reason)
                return "latched"
        self._begin_now(step)
        done = step.ctl.observe(j, host[:b].tolist(), host[b:2 * b].view(np.float32).tolist())
        self.slots_observed += 1
        return "done" if done else "drafting"

    def _head_of(self, model):
        """(logits processor, head, shard) when drafts can be taken from vocabulary shards, else None."""
        lp = getattr(model, "logits_processor", None)
        head = getattr(model, "lm_head", None)
        shard = getattr(head, "shard_indices", None)
        ok = (self.local_vocab and lp is not None and shard is not None
              and getattr(lp, "scale", None) == 1.0
              and getattr(lp, "soft_cap", 0.0) is None
              and not getattr(lp, "logits_as_input", True)
              and shard.num_added_elements == 0)
        return (lp, head, shard) if ok else None

    def _top1(self, proposer, hidden_states) -> tuple[torch.Tensor, torch.Tensor]:
        """TP=1: the stock greedy token (argmax of the draft logits, lowest id on ties) and the
        slot's host row (the tokens, then their probabilities' bits), both from one launch: the
        host's per-slot work is that launch and one copy."""
        logits = proposer.model.compute_logits(hidden_states)
        return draft_top1(logits, logits.shape[-1])

    def _top1_collective(self, proposer, hidden_states, step: _Step, defer: bool = False):
        """TP>1: (token, confidence, faulted flags, this rank's fault, faulted ranks) for one draft
        slot. Every rank reaches the same exchange whatever happened locally; a rank with a fault
        (pending, a poisoned step, or raised here before the exchange) sends NaN. ``defer``
        (look-ahead): the per-rank flags stay on the device, to travel with the slot's host copy,
        and a faulted row's token is a valid id (0) for the forward that runs ahead; else the
        faulted ranks are read now, the same list on every rank. With the head readable by shard the
        exchange is the three per-row stats (the token without gathering the rows); otherwise a
        one-flag gather before vLLM's gathered logits."""
        from vllm.distributed import (get_tensor_model_parallel_world_size,
                                      tensor_model_parallel_all_gather)

        model = proposer.model
        tp = get_tensor_model_parallel_world_size()
        b = int(hidden_states.shape[0])
        local_reason = self.fault_pending if (self.fault_pending or step.poisoned) else None
        if step.poisoned and local_reason is None:
            local_reason = "step preparation failed"
        head = self._head_of(model)
        if head is None:
            flag = hidden_states.new_zeros((1, 1), dtype=torch.float32)
            if local_reason:
                flag.fill_(float("nan"))
            bad = torch.isnan(tensor_model_parallel_all_gather(flag, dim=-1).view(tp))
            if not defer:
                faulted = [r for r, f in enumerate(bad.tolist()) if f]
                if faulted:
                    return None, None, None, local_reason, faulted
            logits = model.compute_logits(hidden_states)  # stock: gathered rows
            token, conf = sample_top1(logits, 0, logits.shape[-1])
            return token, conf, (bad if defer else None), local_reason, []
        lp, lm_head, shard = head
        if not getattr(proposer, "_radiance_local_vocab_logged", False):
            proposer._radiance_local_vocab_logged = True
            logger.info("radiance: dynamic-draft samples drafts from vocabulary shards (TP=%d, "
                        "3 floats per row exchanged)", tp)
        stats = None
        if not local_reason:
            try:
                check_vocab(lp.org_vocab_size)
                local = lp._apply_head(lm_head, hidden_states, None)
                stats = shard_stats(local.reshape(-1, local.shape[-1]), shard.org_vocab_start_index,
                                    shard.num_org_elements)
            except Exception as exc:
                local_reason = f"draft slot: {type(exc).__name__}: {exc}"
        if stats is None:
            stats = hidden_states.new_full((b, 3), float("nan"), dtype=torch.float32)
        gathered = tensor_model_parallel_all_gather(stats.contiguous(), dim=-1).view(b, tp, 3)
        nan = torch.isnan(gathered[..., 0])
        bad = nan.any(dim=0) if b else gathered.new_zeros(tp, dtype=torch.bool)
        if not defer:
            faulted = [r for r, f in enumerate(bad.tolist()) if f]
            if faulted:
                return None, None, None, local_reason, faulted
            token, conf = combine(gathered)
            return token, conf, None, local_reason, []
        token, conf = combine(torch.nan_to_num(gathered, nan=0.0))
        token = torch.where(nan.any(dim=1), torch.zeros_like(token), token)
        return token, conf, bad, local_reason, []

    def _make_propose(self, orig):
        patch = self

        @functools.wraps(orig)
        def propose(self, num_speculative_tokens, *args, **kwargs):
            step: _Step | None = getattr(self, STEP_ATTR, None)
            if step is None or patch.latched_off:
                return orig(self, num_speculative_tokens, *args, **kwargs)
            if num_speculative_tokens != step.k:
                setattr(self, STEP_ATTR, None)
                return orig(self, num_speculative_tokens, *args, **kwargs)
            try:
                out = orig(self, num_speculative_tokens, *args, **kwargs)
            except _StopDrafting:
                out = None
            if out is not None and step.pending is not None and not patch.latched_off:
                try:  # the loop ended on a slot still undecided (it always decides its last one)
                    patch._settle(step)
                except Exception as exc:
                    patch._fault_after_exchange(exc, patch._tp()[0])
            if out is not None and (patch.latched_off or step.ctl is None or not step.ctl.done):
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
                patch.fault(f"draft assembly: {type(exc).__name__}: {exc}")
                step.drafts = None
                mtp = torch.tensor(list(zip(*step.ctl.mtp)), dtype=torch.int64, device=self.device)
                return mtp if step.ragged else _pad_width(mtp, step.k)

        return propose


_PROBABILISTIC = "draft sampling is probabilistic and a request is not greedy"
_V2_REASON = ("vLLM built Model Runner V2, whose MTP proposer this patch does not hook: stock "
              "MTP. Set VLLM_USE_V2_MODEL_RUNNER=0 to use dynamic-draft")


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


DYNAMIC_DRAFT = DynamicDraftPatch()
PATCHES = [DYNAMIC_DRAFT]
