"""dynamic-draft's patches on vLLM's Scheduler and V1 runner: the depth left on the step, what is read
from a finished step, the padding to the verified width, and how it fails closed. Most scheduler and runner
objects are stand-ins with the attributes vLLM 0.32 reads and writes; the Model Runner V2 path runs vLLM's
own AsyncScheduler (with V2 faked: it needs Triton on a GPU). Real vLLM runs the V1 path end to end in
tests/e2e/test_dynamic_draft_lossless.py."""
from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from radiance import patching
from radiance.draft.depth_policy import DepthPolicy
from radiance.draft.patch_runner import DEPTH_ATTR, RunnerHooks, pad_drafts, pad_probs
from radiance.draft.patch_scheduler import POLICY_ATTR, DynamicDraftPatch, PolicyLookup, why_not
from radiance.draft.telemetry import DraftCounters

pytest.importorskip("vllm")


def _patch() -> DynamicDraftPatch:
    p = DynamicDraftPatch()
    p.counters = DraftCounters()
    return p


def _config(k=4, method="mtp", v2=False, schedule=None, max_num_seqs=256):
    spec = types.SimpleNamespace(method=method, num_speculative_tokens=k,
                                 num_speculative_tokens_per_batch_size=schedule)
    return types.SimpleNamespace(speculative_config=spec, use_v2_model_runner=v2,
                                 scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs))


TIERS = [[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]]   # what the launcher writes for k = 4


def test_on_v2_the_depth_is_chosen_only_where_vllm_captured_every_depth():
    assert why_not(_config(v2=True, schedule=TIERS)) is None
    assert "[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]" in why_not(_config(v2=True))
    assert "depth 1, 2, 3 is not among them" in why_not(_config(v2=True, schedule=[[1, 8, 4]]))
    assert "depth 4" in why_not(_config(v2=True, schedule=TIERS, max_num_seqs=3))   # the tail is cut at 3
    assert "depth 1, 2, 3, 4" in why_not(_config(v2=True, schedule=[[2, 2, 2]]))    # vLLM refuses it
    # on V1 vLLM's own schedule forces piecewise graphs: a user's schedule there is theirs, and the patch declines
    assert "num_speculative_tokens_per_batch_size" in why_not(_config(schedule=TIERS))
    assert why_not(_config()) is None


def test_declined_on_v2_the_launchers_tiers_give_way_to_the_configured_depth_and_a_users_schedule_stays():
    p = _patch()
    cut = types.SimpleNamespace(vllm_config=_config(v2=True, schedule=TIERS, max_num_seqs=3),
                                dynamic_sd_lookup=[0, 1, 2, 3])        # vLLM's table: depth 4 never captured
    assert p.attach(cut) is False and cut.dynamic_sd_lookup == [4, 4, 4, 4]
    own = types.SimpleNamespace(vllm_config=_config(v2=True, schedule=[[1, 8, 4]]), dynamic_sd_lookup=[0] + [4] * 8)
    assert p.attach(own) is False and own.dynamic_sd_lookup == [0] + [4] * 8
    table = types.SimpleNamespace(vllm_config=_config(v2=True, schedule=TIERS), dynamic_sd_lookup=[0, 1, 2, 3, 4])
    assert isinstance(p.attach(table), DepthPolicy) and isinstance(table.dynamic_sd_lookup, PolicyLookup)


def test_on_faked_v2_vllms_own_scheduler_schedules_the_depth_the_policy_chose(monkeypatch, tmp_path):
    """vLLM's AsyncScheduler, built from a real engine config of the tiny Qwen3.5 with MTP k = 4: the patch
    replaces its depth lookup, each step's num_spec_tokens_to_schedule is the policy's choice, and the next
    step verifies exactly that many drafts (its requests' scheduled tokens). Model Runner V2 is faked on (it
    needs Triton on a GPU); nothing else is."""
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from radiance.draft.patch_scheduler import SchedulerHooks

    monkeypatch.setattr("vllm.plugins.plugins_loaded", True)   # this process's vLLM classes stay unpatched
    cfg = EngineArgs(model=str(Path(__file__).resolve().parents[3] / "models" / "tiny-qwen3.5-trained"), dtype="bfloat16", max_model_len=256, max_num_seqs=8,
                     enable_prefix_caching=False, async_scheduling=True,
                     speculative_config={"method": "mtp", "num_speculative_tokens": 4,
                                         "num_speculative_tokens_per_batch_size": TIERS}).create_engine_config()
    cfg.cache_config.num_gpu_blocks = 64
    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: True))
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=16, dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    p = _patch()
    p.hook(SchedulerHooks)
    try:
        s = AsyncScheduler(vllm_config=cfg, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(cfg),
                           block_size=16)
        for i in range(3):
            s.add_request(Request(request_id=f"r{i}", prompt_token_ids=[1, 2, 3, 4, 5],
                                  sampling_params=SamplingParams(max_tokens=200), pooling_params=None))
        chosen, verified = [], []
        for _ in range(12):
            out = s.schedule()
            chosen.append(out.num_spec_tokens_to_schedule)
            assert getattr(out, DEPTH_ATTR) == out.num_spec_tokens_to_schedule
            drafts = {r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()}
            verified.append(sorted(set(drafts.values())))
            assert all(out.num_scheduled_tokens[r] == n + 1 for r, n in drafts.items())
            ids = list(out.num_scheduled_tokens)
            s.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[7] * (1 + drafts.get(r, 0)) for r in ids]))   # every draft accepted
        assert isinstance(s.dynamic_sd_lookup, PolicyLookup)
        assert verified[1:] == [[d] for d in chosen[:-1]]   # each step verifies what the step before drafted
        assert chosen[:2] == [4, 4] and 1 in chosen          # the configured depth, then the shallowest's probe
        assert p.counters.snapshot()["probe_steps"] > 0
    finally:
        p.revert()


def test_attach_gives_the_scheduler_a_policy_or_declines_once():
    p = _patch()
    s = types.SimpleNamespace(vllm_config=_config())
    policy = p.attach(s)
    assert isinstance(policy, DepthPolicy) and policy.k == 4 and getattr(s, POLICY_ATTR) is policy
    assert p.choose(policy, 8) == 4   # untimed: the configured depth
    ngram = types.SimpleNamespace(vllm_config=_config(method="ngram"))
    assert p.attach(ngram) is False and getattr(ngram, POLICY_ATTR) is False


def test_a_pinned_depth_replaces_the_policys_choice_and_is_what_the_counters_see(monkeypatch):
    monkeypatch.setenv("RADIANCE_DRAFT_PIN_DEPTH", "3")
    p = _patch()
    assert p.guard() is None and p.pin == 3
    s = types.SimpleNamespace(vllm_config=_config())
    policy = p.attach(s)
    assert [p.choose(policy, b) for b in (1, 8, 32)] == [3, 3, 3]   # unpinned, untimed: 4
    depths = {labels["depth"]: d for metric, labels, d, _ in p.counters.take_deltas()
              if metric == "radiance:draft_depth_steps"}
    assert depths == {"3": 3}
    monkeypatch.setenv("RADIANCE_DRAFT_PIN_DEPTH", "9")
    assert p.guard() is None and p.choose(policy, 8) == 4          # capped at k
    monkeypatch.setenv("RADIANCE_DRAFT_PIN_DEPTH", "-1")
    assert "RADIANCE_DRAFT_PIN_DEPTH" in p.guard()


def _outputs(drafts: dict[str, int], accepted: dict[str, int], made: int, extra_prefill: bool = False):
    scheduled = {r: n + 1 for r, n in drafts.items()}
    if extra_prefill:
        scheduled["new"] = 17
    so = types.SimpleNamespace(num_scheduled_tokens=scheduled, num_spec_tokens_to_schedule=4,
                               scheduled_spec_decode_tokens={r: [-1] * n for r, n in drafts.items()})
    setattr(so, DEPTH_ATTR, made)
    ids = list(scheduled)
    mro = types.SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[7] * (accepted.get(r, 0) + 1) for r in ids])
    return so, mro


def test_observe_counts_only_drafted_positions_and_times_only_plain_decode_steps():
    p = _patch()
    policy = p.attach(types.SimpleNamespace(vllm_config=_config()))
    so, mro = _outputs({"a": 4, "b": 4}, {"a": 4, "b": 1}, made=2)
    p.observe(policy, so, mro)            # verified 4 drafted (the first step's k)
    # reached with the one before accepted: both at 1, both at 2 (1 accepted), only "a" at 3 and 4
    assert [policy.acceptance.evidence(i) for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    assert policy.acceptance.rate(1) == 1.0
    so, mro = _outputs({"a": 4, "b": 4}, {"a": 4, "b": 4}, made=2)
    p.observe(policy, so, mro)            # verified 2 drafted + 2 padding: the padding's acceptance is not MTP's
    # positions 3 and 4 were not drafted: their evidence only fades by the step's two drafts; position 2
    # gained two drafts, both accepted
    assert policy.acceptance.evidence(3) == pytest.approx(0.99 ** 2)
    assert policy.acceptance.evidence(2) == pytest.approx(2 * 0.99 ** 2 + 2)
    policy.choose(2)
    for _ in range(3):
        p.observe(policy, so, mro)
    assert 2 in policy.worth(2)
    mixed = _patch()
    mp = mixed.attach(types.SimpleNamespace(vllm_config=_config()))
    mp.choose(3)
    so, mro = _outputs({"a": 4, "b": 4}, {"a": 4, "b": 1}, made=4, extra_prefill=True)
    for _ in range(5):
        mixed.observe(mp, so, mro)
    assert mp.worth(3) == {} and mp.acceptance.rate(1) == 1.0   # counted, never timed


def test_a_policy_that_raises_latches_off_and_every_later_step_runs_the_configured_depth():
    p = _patch()

    class Broken(DepthPolicy):
        def choose(self, batch_size):
            raise ValueError("boom")

    try:
        assert p.choose(Broken(4), 3) == 4 and p.latched_off and "boom" in p.latch_reason
        assert p.choose(Broken(4), 3) == 4
        assert p.counters.snapshot()["fallback_steps"] == 2
        # the engine core's verdict replaces the workers' row for every rank, in the workers' own payload
        payload = {"ranks": {"0": [{"patch": p.name, "feature": "dynamic_draft", "status": "applied",
                                    "reason": ""}], "1": []}}
        out = p.outgoing(payload)
        assert out is not None and "ranks" not in out
        assert payload["ranks"]["0"][0]["status"] == "failed-at-runtime"
    finally:
        patching.report().outcomes.pop(p.name, None)


def test_outgoing_sends_the_latch_row_when_no_worker_report_passes():
    p = DynamicDraftPatch()
    p._ranks = {"0": [{"patch": p.name, "feature": "dynamic_draft", "status": "applied", "reason": ""}],
                "1": [{"patch": p.name, "feature": "dynamic_draft", "status": "applied", "reason": ""}]}
    assert p.outgoing(None) is None
    p.latched_off, p.latch_reason = True, "depth policy: ValueError: boom"
    out = p.outgoing(None)
    rows = [r for rows in out["ranks"].values() for r in rows]
    assert [r["status"] for r in rows] == ["failed-at-runtime"] * 2 and "boom" in rows[0]["reason"]
    assert p.outgoing(None) is None   # once


def test_padding_repeats_the_last_draft_and_makes_its_proposal_certain():
    t = torch.tensor([[5, 6], [7, 8]])
    assert pad_drafts(t, 4).tolist() == [[5, 6, 6, 6], [7, 8, 8, 8]]
    assert pad_drafts([[1], [], [2, 3, 4, 5]], 4) == [[1, 1, 1, 1], [], [2, 3, 4, 5]]
    probs = torch.full((2, 2, 10), 0.1)
    padded = pad_probs(probs, pad_drafts(t, 4), 4)
    assert padded.shape == (2, 4, 10) and torch.equal(padded[:, :2], probs)
    assert padded[0, 2, 6] == 1.0 and padded[1, 3, 8] == 1.0 and padded[:, 2:].sum() == 4.0


class _Runner:
    """The two things the hook touches on vLLM's runner: its proposal call and draft probabilities."""

    def __init__(self, patch, fail_at_depth=None):
        self._radiance_draft = patch
        self._draft_probs = None
        self.asked: list[int] = []
        self.fail_at_depth = fail_at_depth

    def _orig_propose_draft_token_ids(self, scheduler_output, *args):
        n = scheduler_output.num_spec_tokens_to_schedule
        self.asked.append(n)
        if n == self.fail_at_depth:
            raise RuntimeError("proposer broke")
        return torch.arange(2 * n).view(2, n)

    propose_draft_token_ids = RunnerHooks.propose_draft_token_ids


def test_runner_drafts_the_chosen_depth_then_pads_to_k():
    p = _patch()
    r = _Runner(p)
    so = types.SimpleNamespace(num_spec_tokens_to_schedule=4)
    setattr(so, DEPTH_ATTR, 2)
    out = r.propose_draft_token_ids(so)
    assert r.asked == [2] and out.shape == (2, 4) and out[:, 2:].eq(out[:, 1:2]).all()
    assert so.num_spec_tokens_to_schedule == 4   # the step's own record is left as vLLM made it
    delattr(so, DEPTH_ATTR)
    assert r.propose_draft_token_ids(so).shape == (2, 4) and r.asked[-1] == 4   # no depth: stock


def test_a_proposer_failing_at_the_shallower_depth_latches_off_and_drafts_k():
    p = _patch()
    r = _Runner(p, fail_at_depth=1)
    so = types.SimpleNamespace(num_spec_tokens_to_schedule=4)
    setattr(so, DEPTH_ATTR, 1)
    try:
        out = r.propose_draft_token_ids(so)
        assert r.asked == [1, 4] and out.shape == (2, 4) and p.latched_off and "proposer broke" in p.latch_reason
        assert r.propose_draft_token_ids(so).shape == (2, 4) and r.asked[-1] == 4
    finally:
        patching.report().outcomes.pop(p.name, None)


def test_under_synthetic_acceptance_the_padding_is_never_accepted():
    # vLLM's synthetic sampler accepts by position, never by token: at depth 2 of 4 the sampler that verifies
    # these drafts must see conditional rates 0 past position 2, and the full rates again at depth 4
    from vllm.v1.sample.rejection_sampler import RejectionSampler  # the attribute the hook swaps is vLLM's

    assert "synthetic_conditional_rates" in RejectionSampler.__init__.__code__.co_names
    p = _patch()
    r = _Runner(p)
    base = torch.tensor([0.9, 0.8, 0.7, 0.6])
    r.rejection_sampler = types.SimpleNamespace(synthetic_conditional_rates=base)
    so = types.SimpleNamespace(num_spec_tokens_to_schedule=4)
    setattr(so, DEPTH_ATTR, 2)
    r.propose_draft_token_ids(so)
    assert r.rejection_sampler.synthetic_conditional_rates.tolist() == pytest.approx([0.9, 0.8, 0.0, 0.0])
    assert base.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6])   # vLLM's own tensor is left as it was
    setattr(so, DEPTH_ATTR, 4)
    r.propose_draft_token_ids(so)
    assert r.rejection_sampler.synthetic_conditional_rates.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6])
    # rates put there from outside (the bench switching profiles in one engine) are the new base
    r.rejection_sampler.synthetic_conditional_rates = torch.tensor([0.5, 0.5, 0.5, 0.5])
    setattr(so, DEPTH_ATTR, 1)
    r.propose_draft_token_ids(so)
    assert r.rejection_sampler.synthetic_conditional_rates.tolist() == pytest.approx([0.5, 0.0, 0.0, 0.0])


def test_outside_synthetic_mode_the_sampler_is_left_alone():
    p = _patch()
    r = _Runner(p)
    r.rejection_sampler = types.SimpleNamespace(synthetic_conditional_rates=None)
    so = types.SimpleNamespace(num_spec_tokens_to_schedule=4)
    setattr(so, DEPTH_ATTR, 2)
    r.propose_draft_token_ids(so)
    assert r.rejection_sampler.synthetic_conditional_rates is None
