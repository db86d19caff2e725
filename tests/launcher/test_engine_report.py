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
