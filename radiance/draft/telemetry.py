"""What the depth policy did, as counters.

The policy runs in vLLM's engine core, beside the scheduler; its counters (the steps by depth, and per
position the drafts really made and accepted, which vLLM's own counters cannot tell from the padding) join the payload of the report
channel there (radiance/report: the scheduler's step stats carry it to the API server), which exports
them next to ``vllm:spec_decode_*`` as the ``radiance:draft_*`` counters (``METRICS`` names them). One
scheduler per engine, whatever the TP size, so nothing is counted twice.
"""
from __future__ import annotations

import threading

# field -> (Prometheus counter name without _total, help, labels); per-depth fields are added on first use
METRICS = {
    "steps": ("radiance:draft_steps", "Steps whose draft depth the dynamic-draft policy chose.", {}),
    "probe_steps": ("radiance:draft_probe_steps", "Steps that held a depth to time it.", {}),
    "fallback_steps": ("radiance:draft_fallback_steps", "Steps that ran vLLM's configured depth.", {}),
}


def depth_field(depth: int) -> str:
    return f"depth_{depth}"


def _metric(name: str) -> tuple[str, str, dict]:
    if name.startswith("depth_"):
        return ("radiance:draft_depth_steps", "Steps by the draft depth chosen.", {"depth": name[6:]})
    if name.startswith("drafted_"):   # 0-based positions, as vLLM's per-position counter
        return ("radiance:draft_position_drafts", "Drafts that really reached this position (not padding).",
                {"position": name[8:]})
    if name.startswith("accepted_"):
        return ("radiance:draft_position_accepted", "Drafted tokens accepted at this position.",
                {"position": name[9:]})
    return METRICS[name]


class DraftCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: dict[str, int] = dict.fromkeys(METRICS, 0)
        self._sent: dict[str, int] = {}

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, v in deltas.items():
                self._c[name] = self._c.get(name, 0) + v

    def record_choice(self, depth: int, probe: bool) -> None:
        with self._lock:
            c = self._c
            c["steps"] += 1
            c["probe_steps"] += int(probe)
            key = depth_field(depth)
            c[key] = c.get(key, 0) + 1

    def record_positions(self, drafted: list[int], accepted: list[int]) -> None:
        """One finished step: per request the drafts the drafter made (the padding left out) and how many
        of them were accepted. What the gate's acceptance check reads where drafts are padded."""
        with self._lock:
            c = self._c
            for n, a in zip(drafted, accepted):
                for i in range(n):
                    c[f"drafted_{i}"] = c.get(f"drafted_{i}", 0) + 1
                for i in range(min(a, n)):
                    c[f"accepted_{i}"] = c.get(f"accepted_{i}", 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)

    def take_deltas(self) -> list[tuple[str, dict, int, str]]:
        """(counter name, labels, increase since the last call, help) for every counter that moved."""
        with self._lock:
            out = []
            for name, value in self._c.items():
                d = value - self._sent.get(name, 0)
                if d:
                    metric, doc, labels = _metric(name)
                    out.append((metric, labels, d, doc))
                    self._sent[name] = value
            return out
