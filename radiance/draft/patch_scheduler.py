"""dynamic-draft in vLLM 0.32's scheduler: how many MTP forwards each step runs, chosen on the host before
the step.

``Scheduler.schedule`` leaves the policy's depth on the step's ``SchedulerOutput`` (``DEPTH_ATTR``), which
reaches every worker with the step (patch_runner.py runs that many MTP forwards and pads the drafts to the
configured width). ``update_from_output`` feeds the policy (depth_policy.py): the drafts each request
verified, how many were accepted, and the time between finished steps. Nothing inside a step waits for the
GPU, so it serves under vLLM's default asynchronous scheduling; one scheduler serves every TP rank, so the
ranks run the same depth by construction.

Why the verified width stays at the configured k: the Qwen3-Next family is hybrid, and vLLM 0.32's
gated-delta-net layers keep each request's convolution window in a buffer of k + 3 columns whose offset for
the next step is the accepted count alone (``causal_conv1d_update``'s ``num_accepted_tokens``, GPU and
CPU): it is right only when the previous step verified exactly k + 1 tokens. A shallower verification (what
vLLM's own ``num_speculative_tokens_per_batch_size`` does) reads the wrong window on every step after it;
vLLM's CPU kernel refuses it outright ("num_accepted_tokens must be in [1, seqlen]", seen here). So the
scheduler keeps ``num_spec_tokens_to_schedule`` and the target verifies k + 1 tokens every step: its full
CUDA graph replays unchanged, and what a shallower depth saves is the drafter's forwards (and their head
calls), which the policy weighs against the acceptance they would have bought.

Lossless: the padding repeats the request's last draft token, which the unchanged rejection sampler
verifies like any other draft.

Fail closed: declined at load (one log line, stock depth) where there is no MTP drafter, one draft slot,
vLLM's own per-batch-size schedule or Model Runner V2 (``why_not``, the same rule in the engine core and in
the workers, which report it); an exception in the policy latches the patch off, and every later step runs
the configured depth (``radiance:draft_fallback_steps`` counts them).
"""
from __future__ import annotations

import logging
import time

from .. import envs
from ..patching import Hooks, Patch
from ..report import channel
from .depth_policy import DepthPolicy
from .patch_runner import DEPTH_ATTR, RUNNER, VIA, RunnerHooks, SyntheticRates
from .telemetry import DraftCounters

logger = logging.getLogger("radiance")

_SCHED = "vllm.v1.core.sched.scheduler.Scheduler"
POLICY_ATTR = "_radiance_draft_policy"   # on the scheduler: its DepthPolicy, or False once declined


def why_not(vllm_config) -> str | None:
    """Why this engine's steps cannot have their depth chosen (None: they can)."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return "no drafter: vLLM decodes without speculative tokens"
    if spec.method != "mtp":
        return f"the drafter is {spec.method}, not MTP: it drafts as stock"
    if spec.num_speculative_tokens < 2:
        return f"num_speculative_tokens is {spec.num_speculative_tokens}: no draft depth to choose, stock MTP"
    if getattr(spec, "num_speculative_tokens_per_batch_size", None):
        return "vLLM's own num_speculative_tokens_per_batch_size chooses the depth: stock"
    if getattr(vllm_config, "use_v2_model_runner", False):
        return ("vLLM built Model Runner V2, whose speculator this patch has not been measured with: stock "
                "MTP. Set VLLM_USE_V2_MODEL_RUNNER=0 to use dynamic-draft")
    return None


class SchedulerHooks(Hooks):
    """``Scheduler`` (and ``AsyncScheduler``, its subclass)."""

    target = _SCHED
    via = VIA

    def schedule(self, *args, **kwargs):
        out = self._orig_schedule(*args, **kwargs)
        draft = self._radiance_draft
        policy = getattr(self, POLICY_ATTR, None)
        if policy is None:
            policy = draft.attach(self)
        if policy and out.total_num_scheduled_tokens > 0:
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
        f"{_SCHED}.schedule",
        f"{_SCHED}.update_from_output",
        f"{RUNNER}.propose_draft_token_ids",
    )

    def __init__(self) -> None:
        super().__init__()
        self.tau = 0.0
        self.schedule: tuple[tuple[int, int], ...] = ()
        self.counters: DraftCounters | None = None
        self._ranks: dict = {}         # the workers' reports as last seen passing through
        self._verified = 0             # drafts the drafter made for the step now running (the rest padding)
        self._latch_sent = False
        self.synthetic = SyntheticRates()  # the runner's, under vLLM's synthetic sampler (patch_runner.py)

    def guard(self) -> str | None:
        try:
            self.tau = envs.get("RADIANCE_DRAFT_TAU")
            self.schedule = tuple(envs.get("RADIANCE_DRAFT_SCHEDULE"))
        except envs.KnobError as exc:  # a bad knob is a startup error, said once and clearly
            return str(exc)
        return None

    def apply(self) -> None:
        self.counters = DraftCounters()
        self.hook(SchedulerHooks)
        self.hook(RunnerHooks)

    def attach(self, scheduler) -> DepthPolicy | bool:
        """On the first step: the scheduler's policy, or a decline said once (False)."""
        why = why_not(scheduler.vllm_config)
        if why is not None:
            logger.warning("radiance: dynamic-draft runs vLLM's configured depth in this engine: %s", why)
            setattr(scheduler, POLICY_ATTR, False)
            return False
        k = scheduler.vllm_config.speculative_config.num_speculative_tokens
        policy = DepthPolicy(k, tau=self.tau, schedule=self.schedule)
        setattr(scheduler, POLICY_ATTR, policy)
        self._verified = k
        logger.info("radiance: dynamic-draft chooses each step's MTP forwards (1..%d) in the scheduler; "
                    "the target verifies %d drafts every step", k, k)
        return policy

    def choose(self, policy: DepthPolicy, batch_size: int) -> int:
        if not self.latched_off:
            try:
                decision = policy.choose(batch_size)
                self.counters.record_choice(decision.depth, decision.probe)
                return decision.depth
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
