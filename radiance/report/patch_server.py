"""The API-server end of the report channel (vLLM 0.32 ``vllm.v1.metrics.loggers.PrometheusStatLogger``).

Hook: ``PrometheusStatLogger._spec_decoding_cls`` -- the class vLLM builds its spec-decoding Prometheus
metrics with (meant to be swapped: it is a class attribute) -- becomes ``RadianceSpecDecodingProm``:
vLLM's own counters as before, plus, from each step's payload,
* every counter a feature reports, as a Prometheus counter of that name (``radiance:draft_steps_total``
  and its family) with vLLM's labels (model_name, engine) and the counter's own;
* ``radiance:patch_status{rank, feature, patch, status, reason} 1`` per TP rank and patch, replaced as a
  whole whenever the gathered reports change.
They land in the registry vLLM's ``/metrics`` serves.
"""
from __future__ import annotations

import logging

import prometheus_client

from ..patching import Patch, resolve
from . import channel

logger = logging.getLogger("radiance")

_LOGGER = "vllm.v1.metrics.loggers.PrometheusStatLogger._spec_decoding_cls"
STATUS_METRIC = "radiance:patch_status"


# One set per process: a second logger (vLLM rebuilds them on some reconfigurations) must not register
# the same names again in the default registry.
_COUNTERS: dict[str, prometheus_client.Counter] = {}
_STATUS: dict[tuple, prometheus_client.Gauge] = {}


def _counter(name: str, doc: str, labelnames: list[str]) -> prometheus_client.Counter:
    if name not in _COUNTERS:
        _COUNTERS[name] = prometheus_client.Counter(name, doc, labelnames=labelnames)
    return _COUNTERS[name]


def _status_gauge(labelnames: list[str]) -> prometheus_client.Gauge:
    key = tuple(labelnames)
    if key not in _STATUS:
        _STATUS[key] = prometheus_client.Gauge(
            STATUS_METRIC, "radiance patch outcome per TP rank (1 = current)",
            labelnames=[*labelnames, "rank", "feature", "patch", "status", "reason"])
    return _STATUS[key]


def _prom_class():
    from vllm.v1.spec_decode.metrics import SpecDecodingProm

    class RadianceSpecDecodingProm(SpecDecodingProm):
        """vLLM's spec-decoding metrics, and radiance's from the payload the stats carry."""

        def __init__(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs):
            super().__init__(speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs)
            self._r_labelnames = list(labelnames)
            self._r_engine_values = {idx: list(v) for idx, v in per_engine_labelvalues.items()}
            self._r_status = _status_gauge(self._r_labelnames)
            self._r_shown: dict[int, list[tuple]] = {}

        def observe(self, spec_decoding_stats, engine_idx: int = 0):
            super().observe(spec_decoding_stats, engine_idx)
            payload = getattr(spec_decoding_stats, channel.FIELD, None)
            if payload:
                try:
                    self._r_observe(payload, engine_idx)
                except Exception as exc:  # the server's metrics must never fail a step
                    logger.warning("radiance: report channel: payload not exported (%s: %s)",
                                   type(exc).__name__, exc)

        def _r_observe(self, payload: dict, engine_idx: int) -> None:
            base = self._r_engine_values.get(engine_idx, [])
            for name, labels, increase, doc in payload.get("counters", []):
                counter = _counter(name, doc, [*self._r_labelnames, *sorted(labels)])
                counter.labels(*base, *(str(labels[k]) for k in sorted(labels))).inc(increase)
            ranks = payload.get("ranks")
            if ranks is not None:
                for values in self._r_shown.get(engine_idx, []):
                    self._r_status.remove(*values)
                shown = []
                for rank in sorted(ranks, key=str):
                    for row in ranks[rank]:
                        values = (*base, str(rank), row.get("feature", ""), row.get("patch", ""),
                                  row.get("status", ""), row.get("reason", "") or "")
                        self._r_status.labels(*values).set(1)
                        shown.append(values)
                self._r_shown[engine_idx] = shown

    return RadianceSpecDecodingProm


class ServerMetricsPatch(Patch):
    name = "report.server"
    feature = ""
    hook_points = (_LOGGER, "vllm.v1.spec_decode.metrics.SpecDecodingProm.observe")

    def apply(self) -> None:
        owner, attr, _ = resolve(_LOGGER)
        self.replace(owner, attr, _prom_class())


PATCHES = [ServerMetricsPatch()]
