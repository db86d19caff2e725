"""Draft counters: what a step adds, the report file, the Prometheus rendering."""
from __future__ import annotations

import json

from radiance.draft.controller import DraftPolicy, StepController
from radiance.draft.telemetry import (DraftCounters, merge, read_reports, render_prometheus,
                                      summary)


def _step():
    ctl = StepController(DraftPolicy(tau=0.28, schedule=()))
    ctl.begin(4, [[1, 9, 9, 9], [-1] * 4], [4, 0])
    ctl.observe(0, [1, 5], [0.9, 0.9])   # row 0 takes the n-gram at slot 0
    ctl.observe(1, [2, 6], [0.9, 0.1])   # row 1: 0.9*0.1 < tau -> stops before slot 2
    assert ctl.done
    ctl.drafts()
    return ctl


def test_record_step_counts(tmp_path):
    c = DraftCounters(report_dir=str(tmp_path), min_interval_s=0.0)
    c.record_step(_step(), k=4)
    c.add(draft_tokens_accepted=3, ngram_tokens_accepted=2)
    snap = c.snapshot()
    assert snap["steps"] == 1 and snap["drafts"] == 2
    assert snap["mtp_forwards_run"] == 2 and snap["mtp_forwards_skipped"] == 2
    assert snap["draft_tokens"] == 4 + 2
    assert snap["ngram_tokens_proposed"] == 4
    assert snap["stop_ngram"] == 1 and snap["stop_tau"] == 1
    files = list(tmp_path.glob("draft-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["counters"] == snap
    assert read_reports(str(tmp_path)) == snap
    s = summary(snap)
    assert s["forwards_skipped_fraction"] == 0.5
    assert s["acceptance_rate"] == 0.5


def test_prometheus_text_and_merge():
    a = {"steps": 2, "mtp_forwards_run": 5, "stop_tau": 1}
    total = merge([a, a])
    text = render_prometheus(total)
    assert "radiance_draft_steps_total 4" in text
    assert 'radiance_draft_mtp_forwards_total{state="run"} 10' in text
    assert 'radiance_draft_stops_total{reason="tau"} 2' in text
    assert text.count("# TYPE radiance_draft_mtp_forwards_total counter") == 1


def test_unwritable_report_dir_is_not_fatal(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = DraftCounters(report_dir=str(blocker / "sub"), min_interval_s=0.0)
    c.record_step(_step(), k=4)
    assert c.report_dir is None and c.snapshot()["steps"] == 1
