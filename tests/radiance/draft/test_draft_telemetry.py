"""Draft counters: what a choice adds, and the increases the report channel takes from them."""
from __future__ import annotations

from radiance.draft.telemetry import DraftCounters


def test_choices_counted_by_depth_and_probe():
    c = DraftCounters()
    c.record_choice(4, probe=False)
    c.record_choice(2, probe=True)
    c.record_choice(4, probe=False)
    c.add(fallback_steps=1)
    snap = c.snapshot()
    assert snap["steps"] == 3 and snap["probe_steps"] == 1 and snap["fallback_steps"] == 1
    assert snap["depth_4"] == 2 and snap["depth_2"] == 1


def test_take_deltas_gives_each_increase_once_named_for_prometheus():
    c = DraftCounters()
    c.record_choice(3, probe=True)
    first = {(name, tuple(sorted(labels.items()))): d for name, labels, d, _ in c.take_deltas()}
    assert first[("radiance:draft_steps", ())] == 1
    assert first[("radiance:draft_probe_steps", ())] == 1
    assert first[("radiance:draft_depth_steps", (("depth", "3"),))] == 1
    assert c.take_deltas() == []  # nothing new
    c.add(fallback_steps=2)
    assert [(n, d) for n, _, d, _ in c.take_deltas()] == [("radiance:draft_fallback_steps", 2)]


def test_positions_count_real_drafts_and_their_acceptance():
    c = DraftCounters()
    c.record_positions([2, 4], [1, 4])
    deltas = {(n, tuple(sorted(l.items()))): d for n, l, d, _ in c.take_deltas()}
    assert deltas[("radiance:draft_position_drafts", (("position", "1"),))] == 2
    assert deltas[("radiance:draft_position_drafts", (("position", "3"),))] == 1
    assert deltas[("radiance:draft_position_accepted", (("position", "0"),))] == 2
    assert deltas[("radiance:draft_position_accepted", (("position", "1"),))] == 1
