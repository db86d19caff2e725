"""radiance/report/channel.py: what rides from the workers to the API server, and when."""
from __future__ import annotations

import types

import pytest

ROW = {"patch": "dynamic_draft.proposer", "feature": "dynamic_draft", "status": "applied", "reason": ""}


def test_nothing_changed_nothing_sent(fresh_channel):
    assert fresh_channel.take_payload() is None


def test_counters_are_sent_as_their_sources_give_them(fresh_channel):
    deltas = [[("radiance:draft_steps_total", {"depth": 2}, 3, "steps")], []]
    fresh_channel.add_counter_source(lambda: deltas.pop(0))
    assert fresh_channel.take_payload() == {"counters": [["radiance:draft_steps_total", {"depth": 2}, 3, "steps"]]}
    assert fresh_channel.take_payload() is None   # a source with nothing new adds nothing


def test_a_source_is_registered_once_and_a_failing_one_costs_nothing(fresh_channel):
    def boom():
        raise RuntimeError("telemetry")

    def one():
        return [("c", {}, 1, "doc")]

    for source in (boom, one, one):
        fresh_channel.add_counter_source(source)
    assert fresh_channel.take_payload() == {"counters": [["c", {}, 1, "doc"]]}


def test_the_ranks_ride_once_per_change(fresh_channel):
    fresh_channel.set_ranks({0: [ROW], 1: [ROW]})
    assert fresh_channel.take_payload() == {"counters": [], "ranks": {"0": [ROW], "1": [ROW]}}
    assert fresh_channel.take_payload() is None
    declined = {**ROW, "status": "declined", "reason": "latched"}
    fresh_channel.update_row("0", declined)
    fresh_channel.update_row("0", {**ROW, "patch": "w4_drafter.linears"})   # a row not there yet is added
    assert fresh_channel.take_payload()["ranks"] == {"0": [declined, {**ROW, "patch": "w4_drafter.linears"}],
                                                      "1": [ROW]}


def test_merge_adds_counters_and_keeps_the_later_ranks(fresh_channel):
    first = {"counters": [["a", {}, 1, "d"]], "ranks": {"0": [ROW]}}
    merged = fresh_channel.merge(None, first)
    assert merged == first and merged["counters"] is not first["counters"]
    merged = fresh_channel.merge(merged, {"counters": [["a", {}, 2, "d"]]})
    assert merged == {"counters": [["a", {}, 1, "d"], ["a", {}, 2, "d"]], "ranks": {"0": [ROW]}}
    later = {**ROW, "status": "mixed"}
    assert fresh_channel.merge(merged, {"counters": [], "ranks": {"0": [later]}})["ranks"] == {"0": [later]}
    assert "ranks" not in fresh_channel.merge(None, {"counters": []})


@pytest.mark.parametrize("rank,kept", [(0, True), (1, False)])
def test_a_local_outcome_after_the_gather_goes_into_rank_0s_row(fresh_channel, monkeypatch, rank, kept):
    import vllm.distributed

    outcome = types.SimpleNamespace(**{**ROW, "status": "failed-at-runtime", "reason": "boom"})
    fresh_channel.on_local_outcome(outcome)
    assert fresh_channel._ranks == {}   # before the gather: the gather takes the whole report
    fresh_channel.set_ranks({0: [ROW]})
    monkeypatch.setattr(vllm.distributed, "get_tp_group", lambda: types.SimpleNamespace(rank_in_group=rank))
    fresh_channel.on_local_outcome(outcome)
    assert fresh_channel._ranks["0"] == ([dict(outcome.__dict__)] if kept else [ROW])


def test_the_payload_survives_vllms_msgpack_channel(fresh_channel):
    """Plain data only: vLLM's own encoder and decoder round-trip it unchanged."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    fresh_channel.add_counter_source(lambda: [("radiance:draft_steps_total", {"depth": 1}, 5, "steps")])
    fresh_channel.set_ranks({0: [ROW]})
    payload = fresh_channel.take_payload()
    assert MsgpackDecoder(dict).decode(MsgpackEncoder().encode(payload)) == payload
