"""Draft counters: what a step adds, and the increases the report channel takes from them."""
from __future__ import annotations

from radiance.draft.controller import DraftPolicy, StepController
from radiance.draft.telemetry import METRICS, DraftCounters, summary


def _step():
    ctl = StepController(DraftPolicy(tau=0.28, schedule=()))
    ctl.begin(4, [[1, 9, 9, 9], [-1] * 4], [4, 0])
    ctl.observe(0, [1, 5], [0.9, 0.9])   # row 0 takes the n-gram at slot 0
    ctl.observe(1, [2, 6], [0.9, 0.1])   # row 1: 0.9*0.1 < tau -> stops before slot 2
    assert ctl.done
    ctl.drafts()
    return ctl


def test_record_step_counts():
    c = DraftCounters()
    c.record_step(_step(), k=4)
    c.add(draft_tokens_accepted=3, ngram_tokens_accepted=2)
    snap = c.snapshot()
    assert snap["steps"] == 1 and snap["drafts"] == 2
    assert snap["mtp_forwards_run"] == 2 and snap["mtp_forwards_skipped"] == 2
    assert snap["draft_tokens"] == 4 + 2
    assert snap["ngram_tokens_proposed"] == 4
    assert snap["stop_ngram"] == 1 and snap["stop_tau"] == 1
    s = summary(snap)
    assert s["forwards_skipped_fraction"] == 0.5
    assert s["acceptance_rate"] == 0.5


def test_take_deltas_gives_each_increase_once_named_for_prometheus():
    c = DraftCounters()
    c.record_step(_step(), k=4)
    first = {(name, tuple(sorted(labels.items()))): d for name, labels, d, _ in c.take_deltas()}
    assert first[("radiance:draft_steps", ())] == 1
    assert first[("radiance:draft_mtp_forwards", (("state", "skipped"),))] == 2
    assert first[("radiance:draft_stops", (("reason", "tau"),))] == 1
    assert c.take_deltas() == []  # nothing new
    c.add(steps=2)
    assert [(n, d) for n, _, d, _ in c.take_deltas()] == [("radiance:draft_steps", 2)]
    # one metric family, one label set per field
    families: dict[str, set] = {}
    for name, labels, _ in ((m, tuple(sorted(l)), d) for m, d, l in METRICS.values()):
        families.setdefault(name, set()).add(labels)
    assert all(len(v) == 1 for v in families.values()), families
