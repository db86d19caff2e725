"""What the dynamic-draft controller did, as counters.

The controller runs inside vLLM's worker process, the endpoint's /metrics is served by another
process, so the counters leave the worker as a small JSON file in RADIANCE_REPORT_DIR
(``draft-<pid>.json``, rewritten at most once a second and on exit). Whoever serves /metrics or
``radiance status`` sums the files with ``merge`` and renders them with ``render_prometheus``.
Only one rank of a TP group records, so nothing is counted twice.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Iterable, Mapping

from .controller import REASONS

FIELDS = (
    "steps",                   # decoding steps the controller ran
    "drafts",                  # request drafts it produced (one per request per step)
    "mtp_forwards_run",        # serial MTP forwards run
    "mtp_forwards_skipped",    # forwards stock MTP would have run, skipped by the loop-break
    "draft_tokens",            # tokens proposed for verification, MTP and n-gram together
    "ngram_tokens_proposed",   # of those, from a verbatim n-gram tail
    "ngram_tokens_accepted",   # n-gram tail tokens the target accepted
    "draft_tokens_accepted",   # all proposed tokens the target accepted
    "fallback_steps",          # steps that ran stock MTP (controller declined or latched off)
) + tuple(f"stop_{r}" for r in REASONS)

_PROM = {
    "steps": ("radiance_draft_steps_total", "Decoding steps run by the dynamic-draft controller.", {}),
    "drafts": ("radiance_draft_requests_total", "Request drafts produced.", {}),
    "mtp_forwards_run": ("radiance_draft_mtp_forwards_total", "Serial MTP forwards.", {"state": "run"}),
    "mtp_forwards_skipped": ("radiance_draft_mtp_forwards_total", "Serial MTP forwards.",
                             {"state": "skipped"}),
    "draft_tokens": ("radiance_draft_tokens_total", "Draft tokens proposed.", {"source": "all"}),
    "ngram_tokens_proposed": ("radiance_draft_tokens_total", "Draft tokens proposed.",
                              {"source": "ngram"}),
    "draft_tokens_accepted": ("radiance_draft_tokens_accepted_total", "Draft tokens accepted.",
                              {"source": "all"}),
    "ngram_tokens_accepted": ("radiance_draft_tokens_accepted_total", "Draft tokens accepted.",
                              {"source": "ngram"}),
    "fallback_steps": ("radiance_draft_fallback_steps_total", "Steps that ran stock MTP.", {}),
}
for _r in REASONS:
    _PROM[f"stop_{_r}"] = ("radiance_draft_stops_total", "Per-request draft stops by reason.",
                           {"reason": _r})


_STOP_FIELD = tuple(f"stop_{r}" for r in REASONS)  # indexed by the controller's reason codes


class DraftCounters:
    def __init__(self, report_dir: str | None = None, min_interval_s: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._c = dict.fromkeys(FIELDS, 0)
        self.report_dir = report_dir or None
        self.min_interval_s = min_interval_s
        self._last_write = 0.0
        self._atexit = False

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, v in deltas.items():
                self._c[name] += v
        self._maybe_write()

    def record_step(self, ctl, k: int) -> None:
        """Count one finished controller step (a ``StepController`` whose ``drafts()`` ran)
        that could have drafted up to ``k`` tokens per request."""
        reasons = ctl.reason
        with self._lock:
            c = self._c
            c["steps"] += 1
            c["drafts"] += ctl.batch_size
            c["mtp_forwards_run"] += ctl.forwards
            c["mtp_forwards_skipped"] += k - ctl.forwards
            c["draft_tokens"] += ctl.draft_tokens
            c["ngram_tokens_proposed"] += ctl.tail_tokens
            for r in set(reasons):
                c[_STOP_FIELD[r]] += reasons.count(r)
        self._maybe_write()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)

    def reset(self) -> None:
        with self._lock:
            self._c = dict.fromkeys(FIELDS, 0)

    # -- export ------------------------------------------------------------------------
    def _maybe_write(self, force: bool = False) -> None:
        if not self.report_dir:
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.min_interval_s:
            return
        self._last_write = now
        if not self._atexit:
            self._atexit = True
            atexit.register(self._maybe_write, True)
        try:
            os.makedirs(self.report_dir, exist_ok=True)
            path = os.path.join(self.report_dir, f"draft-{os.getpid()}.json")
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "time": time.time(), "counters": self.snapshot()}, f)
            os.replace(tmp, path)
        except OSError:
            self.report_dir = None  # telemetry must never cost the server; stop trying


def merge(snapshots: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(FIELDS, 0)
    for snap in snapshots:
        for name in FIELDS:
            total[name] += int(snap.get(name, 0))
    return total


def read_reports(report_dir: str) -> dict[str, int]:
    """Sum of every ``draft-*.json`` in ``report_dir`` (unreadable files are skipped)."""
    snaps = []
    try:
        names = os.listdir(report_dir)
    except OSError:
        return merge(())
    for name in names:
        if name.startswith("draft-") and name.endswith(".json"):
            try:
                with open(os.path.join(report_dir, name)) as f:
                    snaps.append(json.load(f)["counters"])
            except (OSError, ValueError, KeyError):
                continue
    return merge(snaps)


def render_prometheus(counters: Mapping[str, int]) -> str:
    """Prometheus text exposition of the counters (one HELP/TYPE per metric family)."""
    families: dict[str, tuple[str, list[str]]] = {}
    for name in FIELDS:
        metric, help_text, labels = _PROM[name]
        lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
        sample = f"{metric}{{{lab}}} {int(counters.get(name, 0))}" if lab else \
            f"{metric} {int(counters.get(name, 0))}"
        families.setdefault(metric, (help_text, []))[1].append(sample)
    lines = []
    for metric, (help_text, samples) in families.items():
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} counter")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def summary(counters: Mapping[str, int]) -> dict[str, float]:
    """Derived figures for ``radiance status``."""
    run = counters.get("mtp_forwards_run", 0)
    skipped = counters.get("mtp_forwards_skipped", 0)
    proposed = counters.get("draft_tokens", 0)
    accepted = counters.get("draft_tokens_accepted", 0)
    ngram = counters.get("ngram_tokens_proposed", 0)
    return {
        "forwards_skipped_fraction": skipped / (run + skipped) if run + skipped else 0.0,
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "forwards_per_accepted_token": run / accepted if accepted else 0.0,
        "ngram_acceptance_rate": counters.get("ngram_tokens_accepted", 0) / ngram if ngram else 0.0,
        "mean_draft_length": proposed / counters["drafts"] if counters.get("drafts") else 0.0,
    }
