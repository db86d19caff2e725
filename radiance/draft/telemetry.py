"""What the dynamic-draft controller did, as counters.

The controller runs inside vLLM's worker; the counters leave it through vLLM's own channel
(radiance/report): TP rank 0 attaches the change since the last step to its model-runner output,
the engine core moves it into the step's spec-decoding stats, and the API server's Prometheus logger
exports it next to ``vllm:spec_decode_*`` as the ``radiance:draft_*`` counters (``METRICS`` names
them). Only one rank of a TP group records, so nothing is counted twice.
"""
from __future__ import annotations

import threading

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

# field -> (Prometheus counter name without _total, help, labels)
METRICS = {
    "steps": ("radiance:draft_steps", "Decoding steps run by the dynamic-draft controller.", {}),
    "drafts": ("radiance:draft_requests", "Request drafts produced.", {}),
    "mtp_forwards_run": ("radiance:draft_mtp_forwards", "Serial MTP forwards.", {"state": "run"}),
    "mtp_forwards_skipped": ("radiance:draft_mtp_forwards", "Serial MTP forwards.", {"state": "skipped"}),
    "draft_tokens": ("radiance:draft_tokens", "Draft tokens proposed.", {"source": "all"}),
    "ngram_tokens_proposed": ("radiance:draft_tokens", "Draft tokens proposed.", {"source": "ngram"}),
    "draft_tokens_accepted": ("radiance:draft_tokens_accepted", "Draft tokens accepted.", {"source": "all"}),
    "ngram_tokens_accepted": ("radiance:draft_tokens_accepted", "Draft tokens accepted.",
                              {"source": "ngram"}),
    "fallback_steps": ("radiance:draft_fallback_steps", "Steps that ran stock MTP.", {}),
}
for _r in REASONS:
    METRICS[f"stop_{_r}"] = ("radiance:draft_stops", "Per-request draft stops by reason.", {"reason": _r})


_STOP_FIELD = tuple(f"stop_{r}" for r in REASONS)  # indexed by the controller's reason codes


class DraftCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = dict.fromkeys(FIELDS, 0)
        self._sent = dict.fromkeys(FIELDS, 0)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, v in deltas.items():
                self._c[name] += v

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

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)

    def reset(self) -> None:
        with self._lock:
            self._c = dict.fromkeys(FIELDS, 0)

    def take_deltas(self) -> list[tuple[str, dict, int, str]]:
        """(counter name, labels, increase since the last call, help) for every counter that moved."""
        with self._lock:
            out = []
            for name in FIELDS:
                d = self._c[name] - self._sent[name]
                if d:
                    metric, doc, labels = METRICS[name]
                    out.append((metric, labels, d, doc))
                    self._sent[name] = self._c[name]
            return out


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
