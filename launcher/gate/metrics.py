"""Speculative-decoding counters from vLLM's ``/metrics`` (Prometheus text), and what they mean.

vLLM exposes, per engine (labels ``model_name`` and ``engine``):
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:spec_decode_num_accepted_tokens_per_pos_total``
(one series per ``position``, 0 = first speculative token). The gate reads them before and after its
prompt set and works on the difference, summed over engines, so that traffic from before the gate and the
number of data-parallel engines do not matter. The derived figures follow vLLM's own log line
("SpecDecoding metrics: Mean acceptance length ... Per-position acceptance rate ..."):

    mean acceptance length = 1 + accepted / drafts   (the 1 is the bonus token)
    acceptance rate        = accepted / draft tokens
    rate at position i     = accepted at position i / drafts

Parsing uses prometheus_client's parser (a vLLM dependency; pure Python) rather than a regex of our own,
so that escaping, exponents and label quoting are handled the way Prometheus defines them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

SPEC_PREFIX = "vllm:spec_decode_"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# dynamic-draft pads each request's drafts to k: vLLM counts the padding as drafted (and, almost always,
# rejected). radiance's engine counts per position only the drafts really made and their acceptance.
DRAFTED_REAL = "radiance:draft_position_drafts_total"
ACCEPTED_REAL = "radiance:draft_position_accepted_total"
RADIANCE_PREFIX = "radiance:"


class MetricsError(ValueError):
    """The text is not Prometheus exposition format, or counters went backwards."""


@dataclass
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    drafted_real: dict[int, float] = field(default_factory=dict)    # dynamic-draft: drafts made, per position
    accepted_real: dict[int, float] = field(default_factory=dict)   # and accepted, per position

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        def sub(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
            return {p: v - b.get(p, 0.0) for p, v in a.items()}

        d = SpecCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            accepted_per_pos=sub(self.accepted_per_pos, before.accepted_per_pos),
            drafted_real=sub(self.drafted_real, before.drafted_real),
            accepted_real=sub(self.accepted_real, before.accepted_real),
        )
        if min([d.drafts, d.draft_tokens, d.accepted, *d.accepted_per_pos.values(), *d.drafted_real.values(),
                *d.accepted_real.values()]) < 0:
            raise MetricsError("spec-decode counters went backwards between the two reads "
                               "(the server restarted during the gate?)")
        return d


@dataclass
class Snapshot:
    """One read of /metrics: the spec-decode counters (None when the server has no drafter) and every
    ``radiance:`` sample as-is, keyed by ``name{label="value",...}``."""

    spec: SpecCounters | None
    radiance: dict[str, float] = field(default_factory=dict)
    radiance_counters: set[str] = field(default_factory=set)  # keys whose family is a counter


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse(text: str) -> Snapshot:
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and, on some inputs, others
        raise MetricsError(f"not Prometheus text: {exc}") from exc

    spec = SpecCounters()
    seen_spec = False
    radiance: dict[str, float] = {}
    counters: set[str] = set()
    for family in families:
        for s in family.samples:
            name = s.name
            if name.startswith(SPEC_PREFIX):
                if name == DRAFTS:
                    spec.drafts += s.value
                elif name == DRAFT_TOKENS:
                    spec.draft_tokens += s.value
                elif name == ACCEPTED:
                    spec.accepted += s.value
                elif name == ACCEPTED_PER_POS:
                    try:
                        pos = int(s.labels["position"])
                    except (KeyError, ValueError):
                        raise MetricsError(f"{name} sample without an integer position label: "
                                           f"{s.labels}") from None
                    spec.accepted_per_pos[pos] = spec.accepted_per_pos.get(pos, 0.0) + s.value
                else:
                    continue  # _created timestamps and future additions
                seen_spec = True
            elif name.startswith(RADIANCE_PREFIX) and not name.startswith("radiance:patch_status"):
                if name in (DRAFTED_REAL, ACCEPTED_REAL) and s.labels.get("position", "").isdigit():
                    into = spec.drafted_real if name == DRAFTED_REAL else spec.accepted_real
                    pos = int(s.labels["position"])
                    into[pos] = into.get(pos, 0.0) + s.value
                # (the patch outcomes are the deployment's state, not a counter of the gate's traffic)
                key = _key(name, s.labels)
                radiance[key] = radiance.get(key, 0.0) + s.value
                if family.type == "counter" or name.endswith("_total"):
                    counters.add(key)
    return Snapshot(spec=spec if seen_spec else None, radiance=radiance, radiance_counters=counters)


def delta(before: Snapshot, after: Snapshot) -> SpecCounters | None:
    """after − before of the spec-decode counters; None when the server exposes none (no drafter)."""
    if after.spec is None:
        return None
    return after.spec.minus(before.spec or SpecCounters())


def acceptance_stats(d: SpecCounters) -> dict:
    """The derived figures of a counter difference; rates are None when there was nothing to divide by.

    Where dynamic-draft reported the drafts it really made (``drafted_real``), the drafter is judged on
    those: the rate at position i is accepted / drafted there, and the mean acceptance length is
    1 + the sum of those rates, what drafting every position would give. vLLM's own figures, which count
    the padding as rejected drafts, are kept under ``served``."""
    drafts, tokens, accepted = d.drafts, d.draft_tokens, d.accepted
    positions = range(max(d.accepted_per_pos) + 1) if d.accepted_per_pos else range(0)
    per_pos_counts = [d.accepted_per_pos.get(p, 0.0) for p in positions]
    if any(v > 0 for v in d.drafted_real.values()):
        served = acceptance_stats(SpecCounters(drafts, tokens, accepted, d.accepted_per_pos))
        real = range(max(d.drafted_real) + 1)
        made = [d.drafted_real.get(p, 0.0) for p in real]
        kept = [d.accepted_real.get(p, 0.0) for p in real]
        rates = [k / n if n > 0 else None for k, n in zip(kept, made)]
        known = [r for r in rates if r is not None]
        return {**served, "basis": "drafted positions (dynamic-draft pads the rest)",
                "num_drafted_per_pos": [_num(v) for v in made],
                "num_accepted_drafted_per_pos": [_num(v) for v in kept],
                "per_position": rates,
                "mean_acceptance_length": 1.0 + sum(known) if known else None,
                "acceptance_rate": sum(kept) / sum(made) if sum(made) > 0 else None,
                "served": {k: served[k] for k in ("mean_acceptance_length", "acceptance_rate", "per_position")}}
    return {
        "num_drafts": _num(drafts),
        "num_draft_tokens": _num(tokens),
        "num_accepted_tokens": _num(accepted),
        "num_accepted_tokens_per_pos": [_num(v) for v in per_pos_counts],
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else None,
        "acceptance_rate": accepted / tokens if tokens > 0 else None,
        "mean_draft_length": tokens / drafts if drafts > 0 else None,
        "per_position": [v / drafts for v in per_pos_counts] if drafts > 0 else [None] * len(per_pos_counts),
    }


def radiance_delta(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """radiance telemetry as-is: counters as the gate's difference, anything else as last read."""
    delta = {k: _num(v - before.radiance.get(k, 0.0))
             for k, v in after.radiance.items() if k in after.radiance_counters}
    current = {k: _num(v) for k, v in after.radiance.items() if k not in after.radiance_counters}
    out: dict[str, dict[str, float]] = {}
    if delta:
        out["delta"] = delta
    if current:
        out["current"] = current
    return out


def _num(v: float) -> float | int:
    return int(v) if float(v).is_integer() else v
