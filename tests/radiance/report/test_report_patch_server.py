"""radiance/report/patch_server.py: the API server's Prometheus logger exports the payload's counters and
every rank's patch status next to vLLM's own metrics (the real logger class and registry; no server)."""
from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")

import prometheus_client  # noqa: E402

from radiance.report import patch_server  # noqa: E402
from radiance.report.stats import RadianceSpecDecodingStats  # noqa: E402

LABELS = ["model_name", "engine"]


def _prom():
    # No speculative config: vLLM's own spec-decoding counters stay off, ours still export.
    return patch_server._prom_class()(None, LABELS, {0: ["tiny", "0"]})


def _stats(payload: dict) -> RadianceSpecDecodingStats:
    stats = RadianceSpecDecodingStats.new(0)
    stats.radiance = payload
    return stats


def _status(**labels) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(patch_server.STATUS_METRIC,
                                                       {"model_name": "tiny", "engine": "0", **labels})


def test_install_swaps_the_loggers_class_and_revert_restores_it():
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.spec_decode.metrics import SpecDecodingProm

    # Another test in this process may have loaded the plugin already (vLLM loads its general plugins when
    # an engine config is built), so revert must give back what was there, not necessarily vLLM's class.
    before = PrometheusStatLogger._spec_decoding_cls
    patch = patch_server.ServerMetricsPatch()
    assert patch.install(vllm.__version__).status == "applied"
    try:
        cls = PrometheusStatLogger._spec_decoding_cls
        assert issubclass(cls, SpecDecodingProm) and cls is not before
        assert cls.__name__ == "RadianceSpecDecodingProm"
    finally:
        patch.revert()
    assert PrometheusStatLogger._spec_decoding_cls is before


def test_counters_export_with_vllms_labels_and_their_own():
    name = "radiance:test_server_steps"
    prom = _prom()
    prom.observe(_stats({"counters": [[name, {"depth": 2}, 3, "steps"]]}))
    prom.observe(_stats({"counters": [[name, {"depth": 2}, 4, "steps"]]}))
    assert prometheus_client.REGISTRY.get_sample_value(
        f"{name}_total", {"model_name": "tiny", "engine": "0", "depth": "2"}) == 7


def test_status_rows_are_replaced_as_a_whole_when_the_ranks_change():
    row = {"patch": "test.server.patch", "feature": "dynamic_draft", "status": "applied", "reason": ""}
    prom = _prom()
    prom.observe(_stats({"counters": [], "ranks": {"0": [row], "1": [row]}}))
    assert _status(rank="1", feature="dynamic_draft", patch="test.server.patch", status="applied", reason="") == 1
    mixed = {**row, "status": "mixed", "reason": "the TP ranks disagree"}
    prom.observe(_stats({"counters": [], "ranks": {"0": [mixed]}}))
    assert _status(rank="0", feature="dynamic_draft", patch="test.server.patch", status="mixed",
                   reason="the TP ranks disagree") == 1
    assert _status(rank="1", feature="dynamic_draft", patch="test.server.patch", status="applied", reason="") is None
    prom.observe(_stats({"counters": []}))   # no reports in this step: the last ones stay
    assert _status(rank="0", feature="dynamic_draft", patch="test.server.patch", status="mixed",
                   reason="the TP ranks disagree") == 1


def test_a_bad_payload_is_logged_and_costs_the_step_nothing(caplog):
    _prom().observe(_stats({"counters": [["radiance:test_server_bad", {}, "not a number", "doc"]]}))
    assert "payload not exported" in caplog.text
