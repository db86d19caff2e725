"""The GPU lossless check: argmax agreement with ties inside eps, violations outside it."""
from __future__ import annotations

from launcher.bench import lossless


def _row(token_lp: dict[int, float]) -> dict[int, tuple[float, int]]:
    ranked = sorted(token_lp.items(), key=lambda kv: -kv[1])
    return {t: (lp, i + 1) for i, (t, lp) in enumerate(ranked)}


def test_argmax_tokens_pass():
    v = lossless.check([[5, 6]], [[[_row({5: -0.1, 9: -3.0}), _row({6: -0.2, 1: -2.0})]]])
    assert v.ok and v.positions == 2 and v.ties == 0


def test_a_near_tie_is_a_tie_and_a_clear_loss_is_a_violation():
    tie = _row({7: -0.70, 5: -0.80})            # emitted 5, 0.10 behind the top-1
    bad = _row({7: -0.10, 6: -2.60})            # emitted 6, 2.5 behind
    v = lossless.check([[5, 6]], [[[tie, bad]]], eps=0.25)
    assert not v.ok and v.ties == 1 and v.violations == 1
    assert v.first_violations[0]["index"] == 1 and v.first_violations[0]["top1"] == 7
    assert abs(v.max_tie_margin - 0.10) < 1e-6


def test_nothing_checked_is_inconclusive_not_a_pass():
    v = lossless.check([[1]], [[[None]]])
    assert not v.ok and v.inconclusive and v.verdict == "inconclusive" and v.positions == 0


def test_merge_adds_up():
    a = lossless.check([[5]], [[[_row({5: -0.1, 2: -1.0})]]])
    b = lossless.check([[5, 6]], [[[_row({5: -0.1, 2: -1.0}), _row({7: -0.1, 6: -5.0})]]])
    c = lossless.check([[6]], [[[_row({7: -0.1, 6: -5.0})]]])      # unscorable: its prefill token disagrees
    m = lossless.merge({1: a, 8: b, 32: c})
    assert (m.prompts, m.positions, m.violations, m.unscorable, m.ok) == (3, 3, 1, 1, False)
    assert m.verdict == "violations" and m.first_violations[0]["batch"] == 8


def test_a_set_with_one_batch_that_scored_nothing_is_inconclusive_and_names_it():
    """The other batch's positions do not carry it: every batch checked must have scored positions."""
    good = lossless.check([[5]], [[[_row({5: -0.1, 2: -1.0})]], [[_row({5: -0.2, 2: -1.0})]]])
    off = [_row({9: -0.1, 5: -6.0})]
    nothing = lossless.check([[5]], [[off], [off]])                 # B = 1: its only prompt unscorable
    assert good.ok and nothing.inconclusive
    m = lossless.merge({1: nothing, 8: good})
    assert m.positions == 1 and m.violations == 0
    assert not m.ok and m.inconclusive and m.inconclusive_batches == [1]
    d = m.as_dict()
    assert d["verdict"] == "inconclusive" and d["ok"] is False and d["inconclusive_batches"] == [1]


def test_positions_the_passes_disagree_on_are_unstable_not_agreement():
    """A position agrees only when both passes agree: one pass agreeing and the other calling it a violation
    is unstable, counted and not scored (it used to count as agreeing); a batch of nothing but unstable
    positions verified nothing."""
    first = [_row({4: -0.1, 3: -3.0})]
    good = [_row({5: -0.1, 9: -3.0})]
    garbage = [_row({9: -0.1, 5: -6.0})]          # the same position scored wrongly in one pass
    v = lossless.check([[4, 5]], [[first + good], [first + garbage]])
    assert (v.positions, v.unstable, v.violations) == (1, 1, 0) and v.ok
    # every position unstable (one pass right, the other wrong, the prefill token included but not in
    # every pass, so the prompt is not unscorable)
    off_first = [_row({3: -0.1, 4: -3.0})]
    none = lossless.check([[4, 5]], [[first + good], [off_first + garbage]])
    assert (none.positions, none.unstable, none.unscorable, none.violations) == (0, 2, 0, 0)
    assert not none.ok and none.inconclusive and none.as_dict()["unstable"] == 2


def test_a_wrong_token_in_every_pass_is_a_violation_not_unstable():
    first = [_row({4: -0.1, 3: -3.0})]
    garbage = [_row({9: -0.1, 5: -6.0})]
    real = lossless.check([[4, 5]], [[first + garbage], [first + garbage]])   # not the target's choice, twice
    assert not real.ok and real.violations == 1 and real.unstable == 0 and real.verdict == "violations"


def test_a_tie_in_one_pass_and_agreement_in_the_other_is_a_tie():
    agree = [_row({5: -0.1, 9: -3.0})]
    tie = [_row({9: -0.60, 5: -0.70})]            # 5 is 0.10 behind the top-1 in this pass
    v = lossless.check([[5]], [[agree], [tie]], eps=0.25)
    assert (v.positions, v.ties, v.unstable, v.violations) == (1, 1, 0, 0) and v.ok
    assert abs(v.max_tie_margin - 0.10) < 1e-6


def test_a_prompt_whose_prefill_token_disagrees_is_unscorable_not_a_violation():
    # Position 0 is the target's own prefill argmax: no draft made it, so a re-scoring that disagrees there
    # disagrees with the engine's prefill. The prompt is set aside; the other prompt still counts.
    off = [_row({9: -0.1, 5: -6.0}), _row({8: -0.1, 6: -4.0})]
    good = [_row({5: -0.1, 9: -3.0}), _row({6: -0.1, 8: -3.0})]
    v = lossless.check([[5, 6], [5, 6]], [[off, good], [off, good]])
    assert v.unscorable == 1 and v.positions == 2 and v.ok and not v.inconclusive


def test_only_unscorable_prompts_is_inconclusive_not_a_pass():
    off = [_row({9: -0.1, 5: -6.0})]
    v = lossless.check([[5]], [[off], [off]])
    assert not v.ok and v.inconclusive and v.as_dict()["inconclusive"] is True
    assert v.as_dict()["verdict"] == "inconclusive"


def test_a_wrong_draft_after_a_correct_first_token_is_still_a_violation():
    # What an accept-everything drafter does: the prefill token is right, later ones are not.
    rows = [_row({5: -0.1, 9: -3.0}), _row({7: -0.1, 6: -5.0})]
    v = lossless.check([[5, 6]], [[rows], [rows]])
    assert not v.ok and v.violations == 1 and v.unscorable == 0


def test_no_two_rescoring_passes_prefill_the_same_batch():
    """The passes differ in order, and a lone prompt, whose reversal is itself, gets a companion."""
    from launcher.bench.worker import rescore_passes

    assert rescore_passes(3) == [([0, 1, 2], False), ([2, 1, 0], False)]
    assert rescore_passes(1) == [([0], False), ([0], True)]
