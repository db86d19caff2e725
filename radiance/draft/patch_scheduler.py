"""dynamic-draft in vLLM 0.32's scheduler: how many draft tokens each step makes, chosen on the host before
the step.

``update_from_output`` feeds the policy (depth_policy.py): the drafts each request verified, how many were
accepted, and the time between finished steps. Nothing inside a step waits for the GPU, so it serves under
vLLM's default asynchronous scheduling; one scheduler serves every TP rank, so the ranks run the same depth
by construction. Where the choice goes depends on the model runner:

- **Model Runner V2** (vLLM's GPU default). vLLM's own dynamic speculative decoding already carries a depth
  per step: the scheduler reads ``dynamic_sd_lookup[batch_size]`` into ``num_spec_tokens_to_schedule``, the
  runner drafts that many tokens, and the next step verifies that many; V2 captures full CUDA graphs for
  every depth its ``num_speculative_tokens_per_batch_size`` schedule can give, for the target's verification
  and for the MTP speculator alike (vLLM files them so that a step between two capture sizes may miss its
  depth's graph and run piecewise: patch_graphs.py widens that table). The launcher writes a schedule naming
  every depth 1..k (so all are captured), and this patch replaces the scheduler's lookup with the policy
  (``PolicyLookup``): a shallower step saves the drafter's forwards *and* the verification's width. The
  gated-delta-net layers follow a changing width there: their spec-decode convolution and recurrent state
  read the query's real length (``query_start_loc``) and the previous step's accepted count, which V2 keeps
  per request.
- **Model Runner V1** (the CPU runner; a GPU engine told ``VLLM_USE_V2_MODEL_RUNNER=0``). vLLM's schedule
  forces piecewise graphs there, so the depth rides the step's ``SchedulerOutput`` (``DEPTH_ATTR``) to the
  runner (patch_runner.py), which runs that many MTP forwards and pads the drafts to k: the target verifies
  k + 1 tokens every step and its full graph replays unchanged. vLLM 0.32's CPU causal-conv kernel refuses
  a verification shorter than the previous one ("num_accepted_tokens must be in [1, seqlen]"), so on V1
  the width stays k.

Lossless either way: on V2 every draft is a real MTP draft verified by vLLM's own sampler; on V1 the padding
repeats the request's last draft token, which the unchanged rejection sampler verifies like any other.

Fail closed: declined at load (one log line, stock depth) where there is no MTP drafter, one draft slot, on V1
a user's own per-batch-size schedule, or on V2 a schedule that does not give every depth 1..k (``why_not``,
the same rule in the engine core and in the workers, which report it); an exception in the policy latches
the patch off, and every later step runs the configured depth (``radiance:draft_fallback_steps`` counts
them).
"""
from __future__ import annotations

import logging
import time

from .. import envs
from ..features import draft_depth_tiers
from ..patching import Hooks, Patch, resolve
from ..report import channel
from .depth_policy import DepthPolicy
from .patch_graphs import MANAGER, GraphHooks, GraphTable
from .patch_runner import DEPTH_ATTR, RUNNER, VIA, RunnerHooks, SyntheticRates
from .telemetry import DraftCounters

logger = logging.getLogger("radiance")

_SCHED = "vllm.v1.core.sched.scheduler.Scheduler"
POLICY_ATTR = "_radiance_draft_policy"   # on the scheduler: its DepthPolicy, or False once declined


def tiers(vllm_config) -> set[int]:
    """The draft depths Model Runner V2 captures graphs for: every value of vLLM's per-batch-size schedule
    up to ``max_num_seqs`` (empty without one)."""
    spec = vllm_config.speculative_config
    schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if not schedule:
        return set()
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    try:
        dense = build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size=vllm_config.scheduler_config.max_num_seqs,
                                                 vllm_num_speculative_tokens=spec.num_speculative_tokens)
    except ValueError:   # vLLM refuses such a schedule at startup; no depth is captured by it here
        return set()
    return set(dense[1:])


def runs_on_v2(vllm_config) -> bool:
    return bool(getattr(vllm_config, "use_v2_model_runner", False))


def why_not(vllm_config) -> str | None:
    """Why this engine's steps cannot have their depth chosen (None: they can)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return "no drafter: vLLM decodes without speculative tokens"
    if spec.method != "mtp":
        return f"the drafter is {spec.method}, not MTP: it drafts as stock"
    k = spec.num_speculative_tokens
    if k < 2:
        return f"num_speculative_tokens is {k}: no draft depth to choose, stock MTP"
    schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if not runs_on_v2(vllm_config):
        if schedule:
            return "vLLM's own num_speculative_tokens_per_batch_size chooses the depth on Model Runner V1: stock"
        return None
    missing = sorted(set(range(1, k + 1)) - tiers(vllm_config))
    if missing:
        return (f"Model Runner V2 captures graphs only for the depths its num_speculative_tokens_per_batch_size "
                f"schedule gives, and depth {', '.join(map(str, missing))} is not among them: stock MTP. Set "
                f"speculative_config.num_speculative_tokens_per_batch_size to {draft_depth_tiers(k)} (radiance up "
                "does)")
    return None


class PolicyLookup:
    """Stands where vLLM's scheduler keeps its dense batch size -> depth table (``dynamic_sd_lookup``) and
    asks the policy instead, once per step, before the step's output is built."""

    def __init__(self, draft: "DynamicDraftPatch", policy: DepthPolicy) -> None:
        self._draft, self._policy = draft, policy

    def __getitem__(self, batch_size: int) -> int:
        return self._draft.choose(self._policy, batch_size)


class SchedulerHooks(Hooks):
    """``Scheduler`` (and ``AsyncScheduler``, its subclass)."""

    target = _SCHED
    via = VIA

    def schedule(self, *args, **kwargs):
        draft = self._radiance_draft
        policy = getattr(self, POLICY_ATTR, None)
        if policy is None:
            policy = draft.attach(self)   # before vLLM's first schedule: on V2 its lookup is replaced first
        out = self._orig_schedule(*args, **kwargs)
        if policy and out.total_num_scheduled_tokens > 0:
            if isinstance(getattr(self, "dynamic_sd_lookup", None), PolicyLookup):
                setattr(out, DEPTH_ATTR, out.num_spec_tokens_to_schedule)   # chosen inside, by the lookup
            else:
                setattr(out, DEPTH_ATTR, draft.choose(policy, len(out.num_scheduled_tokens)))
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        draft = self._radiance_draft
        policy = getattr(self, POLICY_ATTR, None)
        if policy and not draft.latched_off:
            try:
                draft.observe(policy, scheduler_output, model_runner_output)
            except Exception as exc:
                draft.latch_off(f"step observation: {type(exc).__name__}: {exc}")
        payload = draft.outgoing(getattr(model_runner_output, channel.FIELD, None))
        if payload:
            self._radiance_pending = channel.merge(getattr(self, "_radiance_pending", None), payload)
        return self._orig_update_from_output(scheduler_output, model_runner_output)


class DynamicDraftPatch(Patch):
    name = "dynamic_draft.scheduler"
    feature = "dynamic_draft"
    hook_points = (  # the first is one no base class of vLLM's defines too (tests/e2e/test_plugin_declines.py)
        "vllm.v1.core.sched.output.SchedulerOutput.num_spec_tokens_to_schedule",
        "vllm.v1.spec_decode.dynamic.utils.build_dynamic_sd_schedule_lookup",
        f"{_SCHED}.schedule",
        f"{_SCHED}.update_from_output",
        f"{RUNNER}.propose_draft_token_ids",
    )
    optional_hook = f"{MANAGER}._init_candidates"   # Model Runner V2's graph table, widened where it exists

    def __init__(self) -> None:
        super().__init__()
        self.tau = 0.0
        self.schedule: tuple[tuple[int, int], ...] = ()
        self.pin = 0                   # RADIANCE_DRAFT_PIN_DEPTH: a diagnostic's fixed depth, 0 = the policy's
        self.counters: DraftCounters | None = None
        self._ranks: dict = {}         # the workers' reports as last seen passing through
        self._verified = 0             # drafts the drafter made for the step now running (the rest padding)
        self._latch_sent = False
        self.synthetic = SyntheticRates()  # the runner's, under vLLM's synthetic sampler (patch_runner.py)
        self.graphs = GraphTable()         # V2's CUDA-graph table (patch_graphs.py)

    def guard(self) -> str | None:
        try:
            self.tau = envs.get("RADIANCE_DRAFT_TAU")
            self.schedule = tuple(envs.get("RADIANCE_DRAFT_SCHEDULE"))
            self.pin = envs.get("RADIANCE_DRAFT_PIN_DEPTH")
        except envs.KnobError as exc:  # a bad knob is a startup error, said once and clearly
            return str(exc)
        return None

    def apply(self) -> None:
        self.counters = DraftCounters()
        self.hook(SchedulerHooks)
        self.hook(RunnerHooks)
        try:
            resolve(self.optional_hook)
        except LookupError:   # no Model Runner V2 in this vLLM: nothing of its to widen
            return
        self.hook(GraphHooks)

    def attach(self, scheduler) -> DepthPolicy | bool:
        """On the first step: the scheduler's policy, or a decline said once (False)."""
        cfg = scheduler.vllm_config
        why = why_not(cfg)
        if why is None and runs_on_v2(cfg) and not isinstance(getattr(scheduler, "dynamic_sd_lookup", None), list):
            why = "this vLLM's scheduler keeps no dynamic_sd_lookup table to choose the depth through: stock MTP"
        if why is not None:
            logger.warning("radiance: dynamic-draft runs vLLM's configured depth in this engine: %s", why)
            self._set_aside_tiers(scheduler)
            setattr(scheduler, POLICY_ATTR, False)
            return False
        k = cfg.speculative_config.num_speculative_tokens
        policy = DepthPolicy(k, tau=self.tau, schedule=self.schedule)
        setattr(scheduler, POLICY_ATTR, policy)
        self._verified = k
        if self.pin:
            logger.warning("radiance: dynamic-draft pinned at depth %d by RADIANCE_DRAFT_PIN_DEPTH (diagnostics: "
                           "the policy still runs, its choice is set aside)", min(self.pin, k))
        if runs_on_v2(cfg):
            scheduler.dynamic_sd_lookup = PolicyLookup(self, policy)
            logger.info("radiance: dynamic-draft chooses each step's draft depth (1..%d) in the scheduler; "
                        "Model Runner V2 drafts and verifies that depth with the full CUDA graphs it captured "
                        "for each", k)
        else:
            logger.info("radiance: dynamic-draft chooses each step's MTP forwards (1..%d) in the scheduler; "
                        "the target verifies %d drafts every step (Model Runner V1)", k, k)
        return policy

    @staticmethod
    def _set_aside_tiers(scheduler) -> None:
        """Declined on V2 under the schedule the launcher wrote for this patch (every depth named once, at
        batch size d depth d): vLLM would run it as written, shallow at small batches. The configured depth
        runs at every batch size instead, as the decline says. A user's own schedule is left as it is."""
        spec = scheduler.vllm_config.speculative_config
        lookup = getattr(scheduler, "dynamic_sd_lookup", None)
        schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
        k = getattr(spec, "num_speculative_tokens", 0)
        if isinstance(lookup, list) and schedule and [list(e) for e in schedule] == draft_depth_tiers(k):
            scheduler.dynamic_sd_lookup = [k] * len(lookup)

    def choose(self, policy: DepthPolicy, batch_size: int) -> int:
        if not self.latched_off:
            try:
                decision = policy.choose(batch_size)
                depth, probe = decision.depth, decision.probe
                if self.pin:   # the whole path still runs (choice, counters); only its answer is replaced
                    depth, probe = min(self.pin, policy.k), False
                self.counters.record_choice(depth, probe)
                return depth
            except Exception as exc:
                self.latch_off(f"depth policy: {type(exc).__name__}: {exc}")
        self.counters.add(fallback_steps=1)
        return policy.k

    def outgoing(self, workers: dict | None) -> dict | None:
        """What the engine core adds to the report channel this step: the counters' increases and, once
        the policy latched off, its row in every rank's report (the workers report the patch applied; the
        engine core is where it runs). A worker payload passing through with reports gets the same row."""
        if workers and "ranks" in workers:
            self._ranks = workers["ranks"]
            if self.latched_off:
                workers["ranks"] = self._with_latch(self._ranks)
                self._latch_sent = True
        out: dict = {}
        deltas = self.counters.take_deltas() if self.counters is not None else []
        if deltas:
            out["counters"] = [list(d) for d in deltas]
        if self.latched_off and not self._latch_sent and self._ranks:
            out["ranks"] = self._with_latch(self._ranks)
            self._latch_sent = True
        return out or None

    def _with_latch(self, ranks: dict) -> dict:
        row = {"patch": self.name, "feature": self.feature, "status": "failed-at-runtime",
               "reason": f"engine core (every rank's depth): {self.latch_reason}"}
        return {rank: [row if r.get("patch") == self.name else r for r in rows] for rank, rows in ranks.items()}

    def observe(self, policy: DepthPolicy, scheduler_output, model_runner_output) -> None:
        """A finished step. Its requests verified the drafts of the step before (``self._verified`` of
        them were drafted, the rest padding); it drafted ``DEPTH_ATTR`` for the next."""
        now = time.perf_counter()
        scheduled = scheduler_output.num_scheduled_tokens
        if not scheduled:
            return
        spec = scheduler_output.scheduled_spec_decode_tokens
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        made = getattr(scheduler_output, DEPTH_ATTR, policy.k)
        verified, self._verified = self._verified, made
        drafted: list[int] = []
        accepted: list[int] = []
        clean = len(spec) == len(scheduled)
        for req_id, tokens in spec.items():
            i = index.get(req_id)
            out = sampled[i] if sampled is not None and i is not None and i < len(sampled) else None
            if out is None or len(out) == 0:
                clean = False
                continue
            n = min(len(tokens), verified)
            drafted.append(n)
            accepted.append(min(len(out) - 1, n))
            if scheduled.get(req_id) != len(tokens) + 1:
                clean = False
        policy.observe(now, len(scheduled), drafted, accepted, made, clean)
        if drafted:
            self.counters.record_positions(drafted, accepted)

    def after_load(self, runner) -> str | None:
        """In the workers (whose rows ``radiance status`` shows): the engine core's rule, from the same
        config."""
        cfg = getattr(runner, "vllm_config", None)
        return why_not(cfg) if cfg is not None else None


DYNAMIC_DRAFT = DynamicDraftPatch()
PATCHES = [DYNAMIC_DRAFT]
