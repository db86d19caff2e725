"""Decision logic of the dynamic-draft controller: slot actions, tau, forward cap, all-agree tail."""
from __future__ import annotations

import random

import pytest

from radiance import envs
from radiance.draft.controller import DraftPolicy, StepController, forward_cap

NO_CAP = DraftPolicy(tau=0.28, schedule=())


def run_step(policy, k, mtp, confs, cont, clen):
    """mtp/confs: per request, per slot. Returns (drafts, reasons, forwards)."""
    b = len(clen)
    ctl = StepController(policy)
    ctl.begin(k, cont, clen)
    for j in range(k):
        done = ctl.observe(j, [mtp[i][j] for i in range(b)], [confs[i][j] for i in range(b)])
        if done:
            break
    assert ctl.done
    return ctl.drafts(), ctl.reasons(), ctl.forwards, ctl


M = [101, 102, 103, 104, 105, 106, 107, 108]  # the drafter's tokens, slot by slot
NONE = [-1] * 8


# One request: (name, policy, k, confs, cont, clen, draft, reason, forwards)
SINGLE = [
    ("confident to the end", NO_CAP, 4, [0.9] * 4, NONE, 0, M[:4], "full", 4),
    ("k=1 drafts one token", NO_CAP, 1, [0.1], NONE, 0, M[:1], "full", 1),
    # 0.9 * 0.2 = 0.18 < tau after slot 1: keep mtp[0..1]; no n-gram at slot 2, so slot 2's
    # forward is not run (lookahead)
    ("tau stops, lookahead", NO_CAP, 8, [0.9, 0.2, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
     NONE, 0, M[:2], "tau", 2),
    # same, but the n-gram has a token at slot 2 that might agree: forward 2 runs, disagrees
    ("tau stops after n-gram check", NO_CAP, 8, [0.9, 0.2] + [0.9] * 6,
     [7, 7, 7, 7] + [-1] * 4, 4, M[:2], "tau", 3),
    # the n-gram agrees at slot 2: mtp[:2] + its tail from slot 2 to its length
    ("n-gram agrees at slot 2", NO_CAP, 8, [0.9] * 8,
     [7, 7, 103, 201, 202, 203, -1, -1], 6, [101, 102, 103, 201, 202, 203], "ngram", 3),
    ("n-gram agrees at slot 0", NO_CAP, 8, [0.9] * 8,
     [101, 201, 202, 203, 204, 205, 206, 207], 8, [101, 201, 202, 203, 204, 205, 206, 207],
     "ngram", 1),
    # agreement wins even when the product is already under tau
    # 0.5 * 0.5 < tau when slot 2 is decided, but the n-gram agrees there
    ("n-gram beats tau", NO_CAP, 8, [0.5, 0.5, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9],
     [7, 7, 103, 301, 302, -1, -1, -1], 5, [101, 102, 103, 301, 302], "ngram", 3),
    ("tau 0 never stops", DraftPolicy(tau=0.0, schedule=()), 8, [0.01] * 8, NONE, 0, M, "full", 8),
    ("tau 1 keeps one", DraftPolicy(tau=1.0, schedule=()), 8, [0.99] * 8, NONE, 0, M[:1], "tau", 1),
    ("cap at batch 1", DraftPolicy(tau=0.0, schedule=((1, 3),)), 8, [0.9] * 8, NONE, 0, M[:3], "cap", 3),
    ("cap equal to k is full", DraftPolicy(tau=0.0, schedule=((1, 8),)), 8, [0.9] * 8, NONE, 0, M,
     "full", 8),
    # the free tail is not truncated by the cap: agreement on the last allowed forward
    ("all-agree tail past the cap", DraftPolicy(tau=0.0, schedule=((1, 3),)), 8, [0.9] * 8,
     [7, 7, 103, 201, 202, 203, 204, 205], 8, [101, 102, 103, 201, 202, 203, 204, 205], "ngram", 3),
    # n-gram shorter than the slot: it cannot agree there
    ("n-gram too short to agree", NO_CAP, 8, [0.9] * 8, [7, 7, -1, 103, -1, -1, -1, -1], 2, M,
     "full", 8),
]


@pytest.mark.parametrize("name,policy,k,confs,cont,clen,draft,reason,forwards", SINGLE,
                         ids=[c[0] for c in SINGLE])
def test_single_request(name, policy, k, confs, cont, clen, draft, reason, forwards):
    drafts, reasons, fw, _ = run_step(policy, k, [M[:k]], [confs[:k]], [cont[:k]], [clen])
    assert drafts == [draft]
    assert reasons == [reason]
    assert fw == forwards


def test_batch_loop_break_waits_for_the_last_request():
    # row 0 agrees with its n-gram at slot 0; row 1 drafts until its product falls under tau
    k = 8
    mtp = [[11] * k, [21, 22, 23, 24, 25, 26, 27, 28]]
    confs = [[0.9] * k, [0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9, 0.9]]
    cont = [[11, 12, 13, -1, -1, -1, -1, -1], [-1] * k]
    drafts, reasons, fw, ctl = run_step(NO_CAP, k, mtp, confs, cont, [3, 0])
    assert drafts == [[11, 12, 13], [21, 22, 23]]
    assert reasons == ["ngram", "tau"]
    # row 1: 0.9*0.9*0.3 = 0.243 < 0.28 after slot 2 -> stops before forward 3
    assert fw == 3
    assert ctl.ngram_tokens() == [3, 0]
    assert ctl.reason_counts() == {"ngram": 1, "tau": 1, "cap": 0, "full": 0}


def test_batch_cap_from_schedule_and_free_tail():
    # 8 requests: the default schedule caps forwards at 5 (8:5); row 3 agrees on the 5th
    # forward (slot 4) and keeps the n-gram tail to the full width of 8
    k, b = 8, 8
    policy = DraftPolicy(tau=0.0)
    mtp = [[100 * i + j for j in range(k)] for i in range(b)]
    confs = [[1.0] * k for _ in range(b)]
    cont = [[-1] * k for _ in range(b)]
    clen = [0] * b
    cont[3] = [0, 0, 0, 0, 304, 901, 902, 903]
    clen[3] = 8
    drafts, reasons, fw, _ = run_step(policy, k, mtp, confs, cont, clen)
    assert fw == 5
    for i in range(b):
        if i == 3:
            assert drafts[i] == [300, 301, 302, 303, 304, 901, 902, 903]
            assert reasons[i] == "ngram"
        else:
            assert drafts[i] == mtp[i][:5]
            assert reasons[i] == "cap"


@pytest.mark.parametrize("schedule,batch,cap", [
    ((), 1, None), ((), 64, None),
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 1, 8),
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 2, 7),
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 3, 7),   # carry-forward between entries
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 8, 5),
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 15, 5),
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 16, 4),
    (((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)), 256, 4),
    (((4, 6), (8, 2)), 1, 6),                              # below the first entry: its depth
    (((4, 6), (8, 2)), 0, 6),
])
def test_forward_cap(schedule, batch, cap):
    assert forward_cap(schedule, batch) == cap


def _oracle(k, limit, tau, mtp, confs, cont, clen):
    """The rule as the spec states it, one request, no lookahead: (draft, reason, slot)."""
    cum = 1.0
    for j in range(limit):
        if j < clen and cont[j] == mtp[j]:
            return mtp[:j] + cont[j:clen], "ngram", j
        if cum < tau:
            return mtp[:j], "tau", j
        cum *= confs[j]
    return mtp[:limit], ("full" if limit == k else "cap"), limit - 1


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_spec_rule_and_never_runs_more_forwards(seed):
    rng = random.Random(seed)
    for _ in range(300):
        k = rng.choice([1, 2, 4, 8])
        b = rng.choice([1, 2, 3, 8, 17])
        policy = DraftPolicy(tau=rng.choice([0.0, 0.1, 0.28, 0.5, 0.9]),
                             schedule=rng.choice([(), ((1, 8), (2, 7), (4, 6), (8, 5), (16, 4)),
                                                  ((1, 2),)]))
        vocab = rng.choice([2, 3, 50])  # small vocabularies make agreement common
        mtp = [[rng.randrange(vocab) for _ in range(k)] for _ in range(b)]
        confs = [[rng.random() ** 0.5 for _ in range(k)] for _ in range(b)]
        clen = [rng.randrange(k + 1) for _ in range(b)]
        cont = [[rng.randrange(vocab) if j < clen[i] else -1 for j in range(k)] for i in range(b)]
        drafts, reasons, fw, _ = run_step(policy, k, mtp, confs, cont, clen)
        cap = policy.forward_cap(b)
        limit = k if cap is None else min(k, cap)
        want = [_oracle(k, limit, policy.tau, mtp[i], confs[i], cont[i], clen[i]) for i in range(b)]
        assert drafts == [w[0] for w in want]
        assert reasons == [w[1] for w in want]
        # the spec rule needs forward j for the decision at slot j; lookahead may save some
        assert 1 <= fw <= max(w[2] for w in want) + 1
        assert all(1 <= len(d) <= k for d in drafts)


def test_controller_is_reusable_across_steps():
    ctl = StepController(NO_CAP)
    for b in (3, 1, 5):
        ctl.begin(2, [[-1, -1]] * b, [0] * b)
        assert not ctl.observe(0, [1] * b, [0.9] * b)
        assert ctl.observe(1, [2] * b, [0.9] * b)
        assert ctl.drafts() == [[1, 2]] * b


def test_misuse_is_loud():
    ctl = StepController(NO_CAP)
    with pytest.raises(ValueError):
        ctl.begin(0, [], [])
    ctl.begin(4, [[-1] * 4], [0])
    with pytest.raises(ValueError):
        ctl.observe(1, [1], [1.0])
    ctl.observe(0, [1], [1.0])
    with pytest.raises(RuntimeError):
        ctl.drafts()


def test_policy_from_env():
    p = DraftPolicy.from_env({"RADIANCE_DRAFT_TAU": "0.5", "RADIANCE_DRAFT_SCHEDULE": "1:4,8:2"})
    assert p.tau == 0.5 and p.schedule == ((1, 4), (8, 2))
    assert DraftPolicy.from_env({}).schedule == ((1, 8), (2, 7), (4, 6), (8, 5), (16, 4))
    assert DraftPolicy.from_env({"RADIANCE_DRAFT_SCHEDULE": ""}).forward_cap(64) is None
    for bad in ({"RADIANCE_DRAFT_TAU": "1.5"}, {"RADIANCE_DRAFT_TAU": "x"},
                {"RADIANCE_DRAFT_SCHEDULE": "8:5,1:8"}, {"RADIANCE_DRAFT_SCHEDULE": "1-8"}):
        with pytest.raises(envs.KnobError):
            DraftPolicy.from_env(bad)
