"""The dynamic-draft patch: hook points exist, install/decline/revert, and the loop-break."""
from __future__ import annotations

import types

import pytest
import torch

from radiance.draft import patch_proposer as pp
from radiance.draft.controller import DraftPolicy, StepController
from radiance.draft.lookahead import _host_wait, _HostRing
from radiance.draft.slot_capture import ProposerHooks
from radiance.draft.step_control import STEP_ATTR, _Step

vllm = pytest.importorskip("vllm")


@pytest.fixture
def patch(monkeypatch):
    monkeypatch.setenv("RADIANCE_DYNAMIC_DRAFT", "1")
    p = pp.DynamicDraftPatch()
    yield p
    p.revert()


def test_install_replaces_and_revert_restores(patch):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    before = (SpecDecodeBaseProposer.propose, SpecDecodeBaseProposer._sample_draft_tokens,
              GPUModelRunner.propose_draft_token_ids)
    out = patch.install(vllm.__version__)
    assert out.status == "applied", out.reason
    assert SpecDecodeBaseProposer.propose is not before[0]
    assert SpecDecodeBaseProposer._orig_propose is before[0]
    assert patch.install(vllm.__version__).reason == "already applied"
    patch.revert()
    assert (SpecDecodeBaseProposer.propose, SpecDecodeBaseProposer._sample_draft_tokens,
            GPUModelRunner.propose_draft_token_ids) == before


def test_disabled_by_default_and_bad_knobs_decline(monkeypatch):
    monkeypatch.delenv("RADIANCE_DYNAMIC_DRAFT", raising=False)
    assert pp.DynamicDraftPatch().install(vllm.__version__).status == "disabled"
    monkeypatch.setenv("RADIANCE_DYNAMIC_DRAFT", "1")
    monkeypatch.setenv("RADIANCE_DRAFT_SCHEDULE", "8:5,1:8")
    out = pp.DynamicDraftPatch().install(vllm.__version__)
    assert out.status == "declined" and "RADIANCE_DRAFT_SCHEDULE" in out.reason


def test_outside_the_pinned_range_declines(patch):
    assert patch.install("0.31.0").status == "declined"


class FakeProposer:
    """Stands in for SpecDecodeBaseProposer: ``propose`` runs k forwards, sampling after each,
    like vLLM's loop, and counts the forwards that really ran. ``bind`` hooks this class (the
    fixture's revert takes the hooks off again)."""

    def __init__(self, tokens, confs):
        self.tokens, self.confs = tokens, confs  # [k][B]
        self.forwards = 0
        self.device = torch.device("cpu")

    def stock_propose(self, k, *args, **kwargs):
        out = []
        for j in range(k):
            self.forwards += 1
            tok, _ = self._sample_draft_tokens(torch.zeros(len(self.tokens[0]), 4), None)
            out.append(tok)
        return torch.stack(out, dim=1)

    def stock_sample(self, hidden, md):
        return torch.tensor(self.tokens[self.forwards - 1]), None

    propose, _sample_draft_tokens = stock_propose, stock_sample


def slot_row(tokens, confs):
    """What the TP=1 capture returns: the tokens, and the host row [ids | probabilities' bits]."""
    token = torch.tensor(tokens)
    return token, torch.cat([token.to(torch.int32), torch.tensor(confs, dtype=torch.float32).view(torch.int32)])


def bind(patch, fake, monkeypatch):
    monkeypatch.setattr(pp.DynamicDraftPatch, "_top1", staticmethod(
        lambda proposer, hidden: slot_row(proposer.tokens[proposer.forwards - 1],
                                          proposer.confs[proposer.forwards - 1])))
    return hook(patch, fake)


def hook(patch, fake):
    """The proposer's hooks on the fake, as ``apply`` puts them on vLLM's proposer; its ``propose``."""
    patch.hook(ProposerHooks, owner=FakeProposer)
    return fake.propose


def start(fake, k, cont, clen, ragged, schedule=(), lookahead=False):
    ctl = StepController(DraftPolicy(tau=0.28, schedule=schedule))
    ctl.begin(k, cont, clen)
    setattr(fake, STEP_ATTR, _Step(ctl, k, len(clen), ragged, [f"r{i}" for i in range(len(clen))],
                                         lookahead=lookahead, limit=ctl.limit))


@pytest.mark.parametrize("ragged", [True, False])
def test_loop_break_skips_the_remaining_forwards(patch, monkeypatch, ragged):
    k = 8
    # row 0 takes its n-gram at slot 1; row 1 loses confidence: 0.9*0.2 < tau after slot 1
    tokens = [[10, 20], [11, 21], [12, 22], [13, 23], [14, 24], [15, 25], [16, 26], [17, 27]]
    confs = [[0.9, 0.9], [0.9, 0.2]] + [[0.9, 0.9]] * 6
    fake = FakeProposer(tokens, confs)
    propose = bind(patch, fake, monkeypatch)
    start(fake, k, [[99, 11, 5, 6, -1, -1, -1, -1], [-1] * k], [4, 0], ragged)
    out = propose(k)
    assert fake.forwards == 2  # stock would have run 8
    drafts = [[10, 11, 5, 6], [20, 21]]
    if ragged:
        assert out == drafts
    else:  # full width: the draft, then MTP tokens drafted past it, then a repeat
        assert out.tolist() == [[10, 11, 5, 6, 6, 6, 6, 6], [20, 21, 21, 21, 21, 21, 21, 21]]
    assert getattr(fake, STEP_ATTR).drafts == drafts


@pytest.mark.parametrize("ragged", [True, False])
def test_lookahead_runs_one_forward_ahead_and_drafts_the_same(patch, monkeypatch, ragged):
    """Slot j is decided while slot j+1's forward has run: the stop drops that one forward, the
    drafts are the ones decided without look-ahead (test_loop_break_skips_the_remaining_forwards)."""
    k = 8
    tokens = [[10, 20], [11, 21], [12, 22], [13, 23], [14, 24], [15, 25], [16, 26], [17, 27]]
    confs = [[0.9, 0.9], [0.9, 0.2]] + [[0.9, 0.9]] * 6
    fake = FakeProposer(tokens, confs)
    propose = bind(patch, fake, monkeypatch)
    start(fake, k, [[99, 11, 5, 6, -1, -1, -1, -1], [-1] * k], [4, 0], ragged, lookahead=True)
    out = propose(k)
    assert fake.forwards == 3  # one ran ahead of the stop; stock would have run 8
    drafts = [[10, 11, 5, 6], [20, 21]]
    assert (out if ragged else out.tolist()) == (drafts if ragged else
                                                 [[10, 11, 5, 6, 6, 6, 6, 6], [20, 21, 21, 21, 21, 21, 21, 21]])
    assert getattr(fake, STEP_ATTR).drafts == drafts


def test_lookahead_never_runs_past_the_forward_cap(patch, monkeypatch):
    """The cap is known before any confidence: the capped slot is decided at once, nothing runs ahead."""
    k = 8
    fake = FakeProposer([[1, 2]] * k, [[0.99, 0.99]] * k)
    propose = bind(patch, fake, monkeypatch)
    start(fake, k, [[-1] * k, [-1] * k], [0, 0], ragged=True, schedule=((1, 3),), lookahead=True)
    out = propose(k)
    assert fake.forwards == 3 and out == [[1, 1, 1], [2, 2, 2]]


def test_lookahead_defers_the_ngram_read_to_the_first_decision(patch, monkeypatch):
    """start_step with look-ahead: begin() happens when slot 0 is decided, with the same numbers."""
    fake = FakeProposer([[7], [8], [9]], [[0.9]] * 3)
    propose = bind(patch, fake, monkeypatch)
    patch.policy = DraftPolicy(tau=0.28, schedule=())
    patch.lookahead = "1"
    step = patch.start_step(fake, 3, True, ["r0"], torch.tensor([[7, 8, 5, 3]]))
    assert step.lookahead and step.ngram is not None and step.ctl.k == 0  # not begun yet
    out = propose(3)
    assert out == [[7, 8, 5]] and fake.forwards == 2 and step.ngram is None


def test_without_a_step_the_proposer_is_stock(patch, monkeypatch):
    fake = FakeProposer([[1], [2], [3]], [[0.01]] * 3)
    propose = bind(patch, fake, monkeypatch)
    setattr(fake, STEP_ATTR, None)
    assert propose(3).tolist() == [[1, 2, 3]] and fake.forwards == 3


def test_a_failing_slot_latches_off_and_returns_stock(patch, monkeypatch):
    fake = FakeProposer([[1], [2], [3]], [[1.0]] * 3)
    propose = bind(patch, fake, monkeypatch)

    def boom(proposer, hidden):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(pp.DynamicDraftPatch, "_top1", staticmethod(boom))
    start(fake, 3, [[-1] * 3], [0], ragged=True)
    out = propose(3)
    assert patch.latched_off and "capture failed" in patch.latch_reason
    assert out.tolist() == [[1, 2, 3]] and fake.forwards == 3


def test_step_gate_declines_what_it_does_not_handle():
    from vllm.v1.spec_decode.eagle import EagleProposer

    drafter = EagleProposer.__new__(EagleProposer)
    drafter.parallel_drafting = False
    drafter.use_heterogeneous_vocab = False
    drafter.use_local_argmax_reduction = False
    drafter._enable_probabilistic_draft_probs = True
    runner = types.SimpleNamespace(speculative_config=types.SimpleNamespace(method="mtp"),
                                   drafter=drafter, use_async_scheduling=False)
    greedy = types.SimpleNamespace(all_greedy=True)
    mixed = types.SimpleNamespace(all_greedy=False)
    gate = pp.DynamicDraftPatch._step_or_reason
    assert gate(runner, greedy, 8) is None
    runner.use_async_scheduling = True  # a GPU's default with MTP (vLLM's CPU platform turns it off)
    assert "asynchronously" in gate(runner, greedy, 8)
    runner.use_async_scheduling = False
    assert "probabilistic" in gate(runner, mixed, 8)
    assert "two" in gate(runner, greedy, 1)
    drafter.use_local_argmax_reduction = True
    assert "local-argmax" in gate(runner, greedy, 8)
    runner.speculative_config.method = "eagle3"
    assert "not plain MTP" in gate(runner, greedy, 8)
    del drafter.use_local_argmax_reduction  # missing means unsupported, never fine
    runner.speculative_config.method = "mtp"
    assert gate(runner, greedy, 8) is not None


def test_declined_steps_copy_nothing_back_unless_a_controlled_step_is_owed_its_acceptance(patch):
    """Under async scheduling every step declines: none may leave a device->host copy that the step's end
    then waits for (the host would stall every step, which is what declining avoids). After a controlled
    step, the next step's sampled tokens are copied once to credit its drafts."""
    from radiance.draft.step_control import CREDIT_ATTR, STATE_ATTR
    from radiance.draft.telemetry import DraftCounters

    from vllm.v1.spec_decode.eagle import EagleProposer

    drafter = EagleProposer.__new__(EagleProposer)  # plain MTP: only async scheduling declines the step
    drafter.parallel_drafting = drafter.use_heterogeneous_vocab = drafter.use_local_argmax_reduction = False
    drafter._enable_probabilistic_draft_probs = True
    patch.counters = DraftCounters()
    runner = types.SimpleNamespace(drafter=drafter, use_async_scheduling=True,
                                   speculative_config=types.SimpleNamespace(method="mtp"),
                                   input_batch=types.SimpleNamespace(req_ids=["a", "b"]))
    step = types.SimpleNamespace(num_spec_tokens_to_schedule=4)
    sampled = torch.tensor([[5, -1], [6, 7]])
    greedy = types.SimpleNamespace(all_greedy=True)
    patch._prepare(runner, step, sampled, greedy)
    assert patch.steps_declined == {"vLLM schedules asynchronously": 1}
    assert getattr(runner, CREDIT_ATTR, None) is None
    setattr(runner, STATE_ATTR, types.SimpleNamespace(last={"a": (2, 2), "b": (2, 2)}))  # drafts owed
    patch._prepare(runner, step, sampled, greedy)
    req_ids, _ = getattr(runner, CREDIT_ATTR)
    assert req_ids == ["a", "b"]
    patch._settle_credit(runner)
    assert getattr(runner, STATE_ATTR).last == {}  # credited once: 0 for "a", 1 for "b"


# --- one truth across ranks (TP > 1) ------------------------------------------------------------

def _as_rank(monkeypatch, rank: int, world: int = 2):
    monkeypatch.setattr(pp.DynamicDraftPatch, "_tp", staticmethod(lambda: (world, rank)))


def test_at_tp2_a_local_fault_waits_for_the_exchange(patch, monkeypatch, caplog):
    _as_rank(monkeypatch, 1)
    patch.fault("capture raised")
    assert not patch.latched_off and patch.fault_pending == "capture raised"
    assert "every rank turns it off together at the next draft slot" in caplog.text
    _as_rank(monkeypatch, 0, world=1)
    other = pp.DynamicDraftPatch()
    other.fault("boom")
    assert other.latched_off  # TP=1: nobody to agree with


@pytest.mark.parametrize("rank", [0, 1])
def test_the_exchange_latches_every_rank_at_the_same_slot(patch, monkeypatch, rank):
    """The slot's exchange said rank 1 faulted: whichever rank this is, it latches at that slot and
    the rest of the step is stock MTP (the same forwards as its peer)."""
    _as_rank(monkeypatch, rank)
    tokens = [[10, 20], [11, 21], [12, 22], [13, 23]]
    fake = FakeProposer(tokens, [[0.9, 0.9]] * 4)
    if rank == 1:
        patch.fault_pending = "injected"
    seen = []

    def exchange(proposer, hidden, step, defer=False):
        seen.append(step.slot)
        if step.slot == 1:
            return None, None, None, "injected" if rank == 1 else None, [1]
        return (torch.tensor(tokens[proposer.forwards - 1]), torch.tensor([0.9, 0.9]), None, None, [])

    monkeypatch.setattr(patch, "_top1_collective", exchange)
    propose = hook(patch, fake)
    start(fake, 4, [[-1] * 4, [-1] * 4], [0, 0], ragged=False)
    out = propose(4)
    assert patch.latched_off and seen == [0, 1]
    assert fake.forwards == 4 and out.tolist() == [[10, 11, 12, 13], [20, 21, 22, 23]]
    if rank == 1:
        assert "fault on TP rank 1" in patch.latch_reason and "injected" in patch.latch_reason
    else:
        assert "TP rank(s) 1 faulted" in patch.latch_reason
    assert patch.fault_pending is None


def test_the_stats_exchange_carries_a_peer_fault(patch, monkeypatch):
    """The local-vocabulary exchange itself: this rank healthy, its peer sent NaN stats."""
    import vllm.distributed as dist

    _as_rank(monkeypatch, 0)
    monkeypatch.setattr(dist, "get_tensor_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(dist, "tensor_model_parallel_all_gather",
                        lambda t, dim=-1: torch.cat([t, torch.full_like(t, float("nan"))], dim=dim))
    logits = torch.randn(3, 64)
    shard = types.SimpleNamespace(org_vocab_start_index=0, num_org_elements=64, num_added_elements=0)
    lp = types.SimpleNamespace(scale=1.0, soft_cap=None, logits_as_input=False, org_vocab_size=128,
                               _apply_head=lambda head, h, bias: logits)
    model = types.SimpleNamespace(logits_processor=lp, lm_head=types.SimpleNamespace(shard_indices=shard))
    proposer = types.SimpleNamespace(model=model)
    step = _Step(None, 4, 3, False, ["a", "b", "c"])
    token, conf, _, why, faulted = patch._top1_collective(proposer, torch.zeros(3, 8), step)
    assert token is None and faulted == [1] and why is None
    # look-ahead: the flags travel on (no host read here) and the faulted rows' tokens stay valid ids
    token, conf, flags, why, faulted = patch._top1_collective(proposer, torch.zeros(3, 8), step, defer=True)
    assert faulted == [] and flags.tolist() == [False, True] and token.tolist() == [0, 0, 0]
    # and a healthy peer: the combined token is the argmax over both shards (here: this one)
    monkeypatch.setattr(dist, "tensor_model_parallel_all_gather",
                        lambda t, dim=-1: torch.cat([t, torch.tensor([[-1e9, 1.0, 64.0]] * 3)], dim=dim))
    token, conf, _, _, faulted = patch._top1_collective(proposer, torch.zeros(3, 8), step)
    assert faulted == [] and token.tolist() == logits.argmax(-1).tolist()
    token_la, conf_la, flags, _, _ = patch._top1_collective(proposer, torch.zeros(3, 8), step, defer=True)
    assert flags.tolist() == [False, False] and torch.equal(token_la, token) and torch.equal(conf_la, conf)


@pytest.mark.parametrize("rank", [0, 1])
def test_with_lookahead_the_fault_flags_travel_with_the_slot(patch, monkeypatch, rank):
    """Look-ahead at TP=2: slot 1's exchange flags rank 1; every rank learns it when slot 1 is
    decided (during slot 2) and latches there; the step finishes as stock MTP on both."""
    _as_rank(monkeypatch, rank)
    tokens = [[10, 20], [11, 21], [12, 22], [13, 23]]
    fake = FakeProposer(tokens, [[0.9, 0.9]] * 4)
    if rank == 1:
        patch.fault_pending = "injected"

    def exchange(proposer, hidden, step, defer=False):
        assert defer == (step.slot < 3)  # the last slot is always decided at once
        flags = torch.tensor([False, step.slot == 1])
        why = "injected" if rank == 1 and step.slot == 1 else None
        return torch.tensor(tokens[proposer.forwards - 1]), torch.tensor([0.9, 0.9]), flags, why, []

    monkeypatch.setattr(patch, "_top1_collective", exchange)
    propose = hook(patch, fake)
    start(fake, 4, [[-1] * 4, [-1] * 4], [0, 0], ragged=False, lookahead=True)
    out = propose(4)
    assert patch.latched_off and fake.forwards == 4
    assert out.tolist() == [[10, 11, 12, 13], [20, 21, 22, 23]]
    assert ("fault on TP rank 1" if rank == 1 else "TP rank(s) 1 faulted") in patch.latch_reason


def test_host_ring_cpu_tensor_is_a_plain_copy():
    t = torch.arange(6, dtype=torch.int32).view(2, 3)
    host, event = _HostRing().copy(_HostRing.SLOT, t)
    t.zero_()
    assert event is None and host.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.gpu
def test_host_ring_rows_do_not_alias_and_grow():
    ring = _HostRing()
    a = torch.arange(4, dtype=torch.int32, device="cuda")
    b = torch.arange(600, dtype=torch.int32, device="cuda").view(2, 300)  # wider than the first buffer
    ca = ring.copy(ring.SLOT, a)
    cb = ring.copy(ring.SLOT + 20, b)  # a row past the first allocation
    cn = ring.copy(ring.NGRAM, a * 7)
    assert _host_wait(ca).tolist() == [0, 1, 2, 3]
    assert _host_wait(cb).tolist() == b.cpu().tolist()
    assert _host_wait(cn).tolist() == [0, 7, 14, 21]
    assert ca[0].is_pinned() and cb[0].is_pinned()
