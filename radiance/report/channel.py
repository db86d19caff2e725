"""What rides from the workers to the API server each step (plain data: pickled by vLLM's executor,
msgpack-encoded by its engine-core channel).

``payload = {"counters": [[name, labels, increase, help], ...], "ranks": {rank: [outcome, ...]}}``
"ranks" only when the gathered reports changed since the last payload.
"""
from __future__ import annotations

import threading
from typing import Callable

FIELD = "radiance"  # the attribute / dataclass field the payload travels in

_SOURCES: list[Callable[[], list]] = []
_lock = threading.Lock()
_ranks: dict[str, list[dict]] = {}
_ranks_version = 0
_sent_version = 0


def add_counter_source(take_deltas: Callable[[], list]) -> None:
    """Register ``take_deltas() -> [(name, labels, increase, help), ...]`` (a feature's counters)."""
    if take_deltas not in _SOURCES:
        _SOURCES.append(take_deltas)


def set_ranks(ranks: dict[str, list[dict]]) -> None:
    """The gathered per-rank reports (TP rank 0 only keeps them)."""
    global _ranks, _ranks_version
    with _lock:
        _ranks = {str(k): list(v) for k, v in ranks.items()}
        _ranks_version += 1


def update_row(rank: str, row: dict) -> None:
    """Replace (or add) one patch's row in one rank's report, as TP rank 0 knows it."""
    global _ranks_version
    with _lock:
        rows = _ranks.setdefault(str(rank), [])
        for i, old in enumerate(rows):
            if old["patch"] == row["patch"]:
                rows[i] = dict(row)
                break
        else:
            rows.append(dict(row))
        _ranks_version += 1


def on_local_outcome(outcome) -> None:
    """Report listener: what this process records after the gather, on TP rank 0, goes into its row."""
    if not _ranks:
        return  # before the gather: the gather takes the whole report
    try:
        from vllm.distributed import get_tp_group

        if get_tp_group().rank_in_group != 0:
            return
    except Exception:
        return
    update_row("0", dict(outcome.__dict__))


def take_payload() -> dict | None:
    """The payload for this step, or None when nothing changed."""
    global _sent_version
    counters = []
    for take in list(_SOURCES):
        try:
            counters.extend([list(c) for c in take()])
        except Exception:  # telemetry must never cost a step
            continue
    with _lock:
        ranks = None
        if _ranks_version != _sent_version:
            ranks, _sent_version = {k: list(v) for k, v in _ranks.items()}, _ranks_version
    if not counters and ranks is None:
        return None
    out: dict = {"counters": counters}
    if ranks is not None:
        out["ranks"] = ranks
    return out


def merge(into: dict | None, payload: dict) -> dict:
    """Two payloads of consecutive steps as one (counters add up, the later reports win)."""
    if into is None:
        return {"counters": list(payload.get("counters", [])), **({"ranks": payload["ranks"]}
                                                                   if "ranks" in payload else {})}
    into.setdefault("counters", []).extend(payload.get("counters", []))
    if "ranks" in payload:
        into["ranks"] = payload["ranks"]
    return into
