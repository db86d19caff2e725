import json

from launcher import telemetry


def test_sums_worker_files_and_renders_prometheus(tmp_path):
    (tmp_path / "draft-1.json").write_text(json.dumps({"pid": 1, "counters": {"steps": 3, "mtp_forwards_run": 5}}))
    (tmp_path / "draft-2.json").write_text(json.dumps({"pid": 2, "counters": {"steps": 4, "BAD NAME": 1}}))
    (tmp_path / "draft-3.json").write_text("{half-written")
    counters = telemetry.read_counters(tmp_path)
    assert counters == {"steps": 7, "mtp_forwards_run": 5}
    text = telemetry.render_prometheus(counters)
    assert "# TYPE radiance:draft_steps_total counter\nradiance:draft_steps_total 7\n" in text

    from prometheus_client.parser import text_string_to_metric_families

    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert names == {"radiance:draft_steps_total", "radiance:draft_mtp_forwards_run_total"}


def test_nothing_when_no_reports(tmp_path):
    assert telemetry.read_counters(tmp_path) == {} and telemetry.render_prometheus({}) == ""
    assert telemetry.read_counters(None) == {}
