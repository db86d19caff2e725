"""Spec-decode counters from /metrics text (fixtures written by vLLM 0.32.0's own metric classes)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.gate import metrics as m

FIXTURES = Path(__file__).parent / "fixtures"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def _log_line_figures() -> dict:
    line = _read("metrics_mtp3_dp2_logline.txt")
    num = r"([0-9.]+)"
    return {
        "mal": float(re.search(rf"Mean acceptance length: {num}", line).group(1)),
        "accepted": int(re.search(rf"Accepted: {num} tokens", line).group(1)),
        "drafted": int(re.search(rf"Drafted: {num} tokens", line).group(1)),
        "per_pos": [float(x) for x in re.search(r"Per-position acceptance rate: ([0-9., ]+),", line)
                    .group(1).split(", ")],
        "rate_pct": float(re.search(rf"Avg Draft acceptance rate: {num}%", line).group(1)),
    }


def test_parse_sums_over_engines():
    snap = m.parse(_read("metrics_mtp3_dp2_after.txt"))
    assert snap.spec is not None
    # engine 0 and engine 1 of the fixture: 50 + 55 drafts, 98 + 142 draft tokens, 61 + 76 accepted
    assert (snap.spec.drafts, snap.spec.draft_tokens, snap.spec.accepted) == (105, 240, 137)
    assert sorted(snap.spec.accepted_per_pos) == [0, 1, 2]
    assert sum(snap.spec.accepted_per_pos.values()) == snap.spec.accepted


def test_delta_matches_vllms_own_log_line():
    before = m.parse(_read("metrics_mtp3_dp2_before.txt"))
    after = m.parse(_read("metrics_mtp3_dp2_after.txt"))
    stats = m.acceptance_stats(m.delta(before, after))
    log = _log_line_figures()
    assert stats["num_accepted_tokens"] == log["accepted"]
    assert stats["num_draft_tokens"] == log["drafted"]
    assert round(stats["mean_acceptance_length"], 2) == log["mal"]
    assert round(stats["acceptance_rate"] * 100, 1) == log["rate_pct"]
    assert [round(p, 3) for p in stats["per_position"]] == log["per_pos"]
    assert stats["mean_acceptance_length"] == pytest.approx(1 + stats["num_accepted_tokens"] / stats["num_drafts"])


def test_no_drafter_means_no_spec_counters():
    snap = m.parse(_read("metrics_no_drafter.txt"))
    assert snap.spec is None
    assert m.delta(snap, snap) is None


def test_radiance_telemetry_reported_as_is():
    before = m.parse(_read("metrics_no_drafter.txt"))
    after = m.parse(_read("metrics_radiance_telemetry.txt"))
    tele = m.radiance_delta(before, after)
    assert tele["delta"] == {'radiance:draft_depth_total{reason="schedule"}': 3,
                             'radiance:draft_depth_total{reason="tau"}': 12}
    assert tele["current"] == {"radiance:draft_tau": 0.28}
    stats = m.acceptance_stats(m.delta(before, after))
    assert stats["mean_acceptance_length"] == 2.5 and stats["acceptance_rate"] == 0.75
    assert stats["per_position"] == [0.9, 0.6]


def test_counters_going_backwards_is_an_error():
    before = m.parse(_read("metrics_mtp3_dp2_after.txt"))
    after = m.parse(_read("metrics_mtp3_dp2_before.txt"))
    with pytest.raises(m.MetricsError, match="went backwards"):
        m.delta(before, after)


def test_zero_drafts_gives_no_rates():
    stats = m.acceptance_stats(m.SpecCounters(accepted_per_pos={0: 0.0, 1: 0.0}))
    assert stats["mean_acceptance_length"] is None and stats["acceptance_rate"] is None
    assert stats["per_position"] == [None, None]


def test_unknown_spec_series_and_created_samples_are_ignored():
    text = _read("metrics_radiance_telemetry.txt") + (
        "# TYPE vllm:spec_decode_future_thing counter\nvllm:spec_decode_future_thing_total 99\n")
    snap = m.parse(text)
    assert snap.spec.drafts == 10


def test_garbage_is_rejected():
    with pytest.raises(m.MetricsError):
        m.parse("this is { not prometheus\n")


def test_dynamic_draft_padding_is_left_out_of_the_drafters_acceptance():
    """vLLM counts dynamic-draft's padding as drafted and rejected; the engine's radiance counters say what
    was really drafted at each position, and the gate judges the drafter on those."""
    from launcher.gate import metrics as gm

    text = "\n".join([
        "# TYPE vllm:spec_decode_num_drafts counter", "vllm:spec_decode_num_drafts_total 10",
        "# TYPE vllm:spec_decode_num_draft_tokens counter", "vllm:spec_decode_num_draft_tokens_total 40",
        "# TYPE vllm:spec_decode_num_accepted_tokens counter", "vllm:spec_decode_num_accepted_tokens_total 12",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 0',
        "# TYPE radiance:draft_position_drafts counter",
        'radiance:draft_position_drafts_total{position="0"} 10',
        'radiance:draft_position_drafts_total{position="1"} 5',
        'radiance:draft_position_drafts_total{position="2"} 2',
        "# TYPE radiance:draft_position_accepted counter",
        'radiance:draft_position_accepted_total{position="0"} 8',
        'radiance:draft_position_accepted_total{position="1"} 4',
        'radiance:draft_position_accepted_total{position="2"} 1', ""])
    stats = gm.acceptance_stats(gm.delta(gm.parse(""), gm.parse(text)))
    assert stats["per_position"] == [0.8, 0.8, 0.5]
    assert stats["mean_acceptance_length"] == pytest.approx(3.1)
    assert stats["served"]["mean_acceptance_length"] == pytest.approx(2.2)   # vLLM's: padding rejected
    assert stats["basis"].startswith("drafted positions")
