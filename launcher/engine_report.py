"""What the engine says about its patches and counters, read from its ``/metrics`` (the plugin's report
channel exports them there: ``radiance:patch_status`` per TP rank, the ``radiance:*`` counters).

The launcher reads text, never the plugin: ``parse(text)`` gives the per-rank rows, one merged row per
patch (ranks that agree: their status; ranks that differ: ``mixed``, with each rank's status in the
reason), and the counters by name (labels folded in: ``draft_tokens{source=ngram}``).

A feature that runs stock for some steps (dynamic-draft: steps vLLM's state keeps from the controller)
gets its step counts beside its row (``steps``: the patch's against stock's, from its counters); with
steps that fell back it is ``partial``, or ``declined`` if the patch ran none, whatever the row said:
the counters may be a step ahead of the row.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

STATUS_METRIC = "radiance:patch_status"
# Summed over in a counter's key: vLLM's labels on every counter (its model name, the engine index) and a
# TP rank, were a counter to carry one (counters count for the deployment).
SUMMED_LABELS = frozenset({"model_name", "engine", "rank"})


@dataclass
class EngineReport:
    ranks: dict[str, list[dict]] = field(default_factory=dict)
    patches: list[dict] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return bool(self.ranks)


def counter_key(name: str, labels: dict[str, str]) -> str:
    """``name`` with radiance's own labels folded in (``draft_tokens{source=ngram}``): the members of a
    labelled family (MTP forwards run and skipped) stay apart."""
    extra = {k: v for k, v in labels.items() if k not in SUMMED_LABELS}
    return name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}" if extra else "")


def merge_ranks(ranks: dict[str, list[dict]]) -> list[dict]:
    order: list[tuple[str, str]] = []
    by_patch: dict[tuple[str, str], dict[str, dict]] = {}
    for rank, rows in sorted(ranks.items()):
        for row in rows:
            key = (row["feature"], row["patch"])
            if key not in by_patch:
                order.append(key)
                by_patch[key] = {}
            by_patch[key][rank] = row
    merged = []
    for key in order:
        per = by_patch[key]
        statuses = {r["status"] for r in per.values()}
        missing = [k for k in ranks if k not in per]
        if len(statuses) == 1 and not missing:
            row = next(iter(per.values()))
            reasons = {r["reason"] for r in per.values()}
            merged.append({**row, "ranks": sorted(per),
                           "reason": row["reason"] if len(reasons) == 1 else
                           "; ".join(f"rank {k}: {per[k]['reason']}" for k in sorted(per))})
        else:
            detail = "; ".join(f"rank {k}: {per[k]['status']}" + (f" ({per[k]['reason']})" if per[k]["reason"] else "")
                               for k in sorted(per))
            detail += "".join(f"; rank {k}: absent" for k in missing)
            merged.append({"feature": key[0], "patch": key[1], "status": "mixed", "reason": detail,
                           "ranks": sorted(per)})
    return merged


# feature -> (counter of the steps the patch ran, counter of those that fell back to stock, how each is said)
STEP_COUNTERS = {"dynamic_draft": ("draft_steps", "draft_fallback_steps", "drafted by dynamic-draft",
                                   "ran stock MTP")}


def with_step_counts(rows: list[dict], counters: dict[str, float]) -> list[dict]:
    out = []
    for row in rows:
        spec = STEP_COUNTERS.get(row["feature"])
        if spec is None or row["status"] not in ("applied", "partial", "declined"):
            out.append(row)
            continue
        ran, stock = int(counters.get(spec[0], 0)), int(counters.get(spec[1], 0))
        row = {**row, "steps": {"patch": ran, "stock": stock}}
        if stock:
            if row["status"] != "declined":
                row["status"] = "partial" if ran else "declined"
            counts = f"{ran} steps {spec[2]}, {stock} {spec[3]}"
            row["reason"] = f"{row['reason']}; {counts}" if row["reason"] else counts
        out.append(row)
    return out


def parse(text: str) -> EngineReport:
    rep = EngineReport()
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("radiance:"):
            continue
        for sample in family.samples:
            if family.name == STATUS_METRIC:
                if sample.value != 1:
                    continue
                lab = sample.labels
                rep.ranks.setdefault(lab.get("rank", "0"), []).append(
                    {"feature": lab.get("feature", ""), "patch": lab.get("patch", ""),
                     "status": lab.get("status", ""), "reason": lab.get("reason", "")})
            elif sample.name.endswith("_total"):
                key = counter_key(sample.name.removeprefix("radiance:").removesuffix("_total"), sample.labels)
                rep.counters[key] = rep.counters.get(key, 0) + sample.value
    rep.patches = with_step_counts(merge_ranks(rep.ranks), rep.counters)
    return rep
