"""What the gateway and `radiance status` read from the engine's /metrics: per-rank patch rows, one
merged row per patch (ranks that differ merge as mixed), the counters by name."""
from __future__ import annotations

from launcher.engine_report import parse

TEXT = '''# HELP radiance:patch_status radiance patch outcome per TP rank (1 = current)
# TYPE radiance:patch_status gauge
radiance:patch_status{engine="0",feature="fp8_stream",model_name="m",patch="fp8_stream.decoder_contract",rank="0",reason="3 input",status="applied"} 1.0
radiance:patch_status{engine="0",feature="fp8_stream",model_name="m",patch="fp8_stream.decoder_contract",rank="1",reason="3 input",status="applied"} 1.0
radiance:patch_status{engine="0",feature="int4_head",model_name="m",patch="int4_head.lm_head",rank="0",reason="",status="applied"} 1.0
radiance:patch_status{engine="0",feature="int4_head",model_name="m",patch="int4_head.lm_head",rank="1",reason="oom",status="declined"} 1.0
radiance:patch_status{engine="0",feature="old",model_name="m",patch="gone",rank="0",reason="",status="applied"} 0.0
# HELP radiance:draft_tokens_total Draft tokens proposed.
# TYPE radiance:draft_tokens_total counter
radiance:draft_tokens_total{engine="0",model_name="m",source="ngram"} 7.0
radiance:draft_tokens_total{engine="0",model_name="m",source="all"} 9.0
# HELP radiance:draft_steps_total Decoding steps.
# TYPE radiance:draft_steps_total counter
radiance:draft_steps_total{engine="0",model_name="m"} 3.0
# HELP vllm:spec_decode_num_drafts_total Drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5.0
'''


def test_rows_by_rank_merged_and_counters():
    rep = parse(TEXT)
    assert sorted(rep.ranks) == ["0", "1"] and rep.known
    by = {p["feature"]: p for p in rep.patches}
    assert by["fp8_stream"]["status"] == "applied" and by["fp8_stream"]["ranks"] == ["0", "1"]
    assert by["int4_head"]["status"] == "mixed"
    assert "rank 0: applied" in by["int4_head"]["reason"] and "rank 1: declined (oom)" in by["int4_head"]["reason"]
    assert "old" not in by  # a series set to 0 is a replaced report
    assert rep.counters == {"draft_tokens{source=ngram}": 7, "draft_tokens{source=all}": 9, "draft_steps": 3}


def test_an_engine_that_has_not_stepped_yet_reports_nothing():
    rep = parse("# HELP vllm:x y\n# TYPE vllm:x gauge\nvllm:x 1.0\n")
    assert not rep.known and rep.patches == [] and rep.counters == {}


def _status(rank: str, feature: str, patch: str, status: str, reason: str = "") -> str:
    return (f'radiance:patch_status{{engine="0",feature="{feature}",model_name="m",patch="{patch}",rank="{rank}",'
            f'reason="{reason}",status="{status}"}} 1.0\n')


def _steps(drafted: int, stock: int) -> str:
    return (f'radiance:draft_steps_total{{engine="0",model_name="m"}} {drafted}.0\n'
            f'radiance:draft_fallback_steps_total{{engine="0",model_name="m"}} {stock}.0\n')


DD = ("dynamic_draft", "dynamic_draft.proposer")


def test_dynamic_draft_with_stock_steps_is_partial_with_counts():
    text = "".join(_status(r, *DD, "partial", "stock MTP for steps where fewer than two draft slots are scheduled")
                   for r in "01") + _steps(5, 3)
    row = parse(text).patches[0]
    assert row["status"] == "partial" and row["steps"] == {"patch": 5, "stock": 3}
    assert row["reason"] == ("stock MTP for steps where fewer than two draft slots are scheduled; "
                             "5 steps drafted by dynamic-draft, 3 ran stock MTP")


def test_counters_ahead_of_an_applied_row_make_it_partial_or_declined():
    row = parse(_status("0", *DD, "applied") + _steps(2, 1)).patches[0]
    assert row["status"] == "partial" and row["reason"] == "2 steps drafted by dynamic-draft, 1 ran stock MTP"
    row = parse(_status("0", *DD, "applied") + _steps(0, 4)).patches[0]
    assert row["status"] == "declined" and row["steps"] == {"patch": 0, "stock": 4}
    row = parse(_status("0", *DD, "applied") + _steps(7, 0)).patches[0]
    assert row["status"] == "applied" and row["steps"] == {"patch": 7, "stock": 0} and row["reason"] == ""


def test_a_latched_or_mixed_row_keeps_its_status():
    row = parse(_status("0", *DD, "failed-at-runtime", "fault on TP rank 1") + _steps(3, 9)).patches[0]
    assert row["status"] == "failed-at-runtime" and "steps" not in row
