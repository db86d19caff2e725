"""dynamic-draft inside vLLM 0.32's MTP proposer (model runner V1: the GPU runner and the CPU one).

The patch (``DynamicDraftPatch``) holds the feature's state and installs three ``Hooks`` classes,
whose methods are the replacement code; it is made of one piece per thing the feature does:

``step_control.py``
    per decoding step, on the model runner: which steps the controller runs, the context mirror, the
    n-gram matcher, a fresh ``StepController`` left on the drafter; the acceptance counters after it.
``slot_capture.py``
    per draft slot, on the proposer: the greedy token and its confidence in one capture, one host
    copy, the controller's decision; the loop-break (``_StopDrafting``) and the drafts handed back.
``tp_exchange.py``
    TP > 1: the slot's exchange between ranks, a fault held pending until it, and the latch every rank
    takes together in the same slot.
``lookahead.py``
    the pinned host ring, and slot j decided while slot j+1's forward runs.

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
  never mistaken for a failure): stock MTP from then on, one warning. At TP > 1 the ranks agree on it
  first (tp_exchange.py).
"""
from __future__ import annotations

from .. import envs
from ..features import ASYNC_SCHEDULING_REASON
from ..patching import Patch, resolve
from .controller import DraftPolicy
from .lookahead import LookAhead, _HostRing
from .slot_capture import _PROPOSER, ProposerHooks, SlotCapture
from .step_control import _RUNNER, _V2_REASON, _WORKER, RunnerHooks, StepControl, WorkerHooks
from .telemetry import DraftCounters
from .tp_exchange import TpExchange


def _vllm_config_v2() -> bool | None:
    try:
        from vllm.config import get_current_vllm_config

        cfg = get_current_vllm_config()
        return bool(cfg.use_v2_model_runner) if cfg is not None and cfg.model_config else None
    except Exception:
        return None


class DynamicDraftPatch(StepControl, SlotCapture, TpExchange, LookAhead, Patch):
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
    # Hooked only to say so when vLLM builds a runner this patch does not hook (V2).
    optional_hook = f"{_WORKER}._make_model_runner"

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
        self.hook(ProposerHooks)
        self.hook(RunnerHooks)
        try:
            resolve(self.optional_hook)
        except LookupError:
            return
        self.hook(WorkerHooks)

    def latch_off(self, reason: str) -> None:
        super().latch_off(reason)
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
        elif getattr(runner, "use_async_scheduling", False):
            why = ASYNC_SCHEDULING_REASON
        else:
            return None
        self.declined_at_load = True  # every step declines alike: the steps add nothing to say
        return why


DYNAMIC_DRAFT = DynamicDraftPatch()
PATCHES = [DYNAMIC_DRAFT]
