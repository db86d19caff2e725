"""What makes a `radiance bench` comparison trustworthy on one machine: synthetic acceptance for dummy
weights, and repeats interleaved across feature sets with their median and spread.

Stock vLLM moved up to ~17% between two calls on one H200 (docs/benchmarks.md), and a set measured
after another inherits whatever the machine did meanwhile. So a round runs every set once, rounds follow
one another (stock, set, stock, set, ...), each set's ratio to stock is taken within its round, and the
report gives the median and the range of the rounds, never one figure.
"""
from __future__ import annotations

import json
import statistics

ACCEPTANCE_FORM = "synthetic:R1,R2,... (per-position unconditional acceptance rates, non-increasing, in [0, 1])"


def parse_acceptance(raw: str) -> list[float]:
    """``synthetic:0.76,0.62,0.46,0.40`` -> the rates; ValueError with the expected form otherwise."""
    kind, _, rest = raw.partition(":")
    if kind.strip().lower() != "synthetic" or not rest.strip():
        raise ValueError(f"expected {ACCEPTANCE_FORM}, got {raw!r}")
    try:
        rates = [float(x) for x in rest.split(",")]
    except ValueError:
        raise ValueError(f"expected {ACCEPTANCE_FORM}, got {raw!r}") from None
    if any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"acceptance rates must lie in [0, 1], got {rates}")
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"acceptance rates must not increase with the position, got {rates}")
    return rates


def acceptance_label(rates: list[float]) -> str:
    """How a row names the acceptance it ran at: ``0.91/0.82/0.75/0.68``."""
    return "/".join(f"{r:g}" for r in rates)


def row_key(row: dict) -> tuple:
    """Rows compare within one acceptance profile and one batch size."""
    return row.get("acceptance"), row["batch"]


def with_synthetic_acceptance(server_args: list[str], rates: list[float]) -> list[str]:
    """The engine's flags with vLLM's synthetic rejection sampler at ``rates``: every draft position is
    accepted with its rate whatever the weights say (dummy weights accept nothing). A drafter shallower
    than the rates gets their first positions: the rates are unconditional, so a prefix stays one profile."""
    args = list(server_args)
    try:
        i = args.index("--speculative-config")
    except ValueError:
        raise ValueError("synthetic acceptance needs a drafter: the profile has none") from None
    spec = json.loads(args[i + 1])
    k = int(spec.get("num_speculative_tokens", 0))
    if len(rates) < k:
        raise ValueError(f"{len(rates)} acceptance rates for a drafter of depth {k}: give one per position")
    spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=rates[:k])
    args[i + 1] = json.dumps(spec, separators=(",", ":"))
    return args


DEPTH_STEPS = "radiance:draft_depth_steps_total{depth="


def depth_steps(counters: dict | None) -> dict[int, float]:
    """The steps dynamic-draft ran at each depth, from a row's counters (empty where it chose none)."""
    return {int(k[len(DEPTH_STEPS):-1]): n for k, n in (counters or {}).items() if k.startswith(DEPTH_STEPS) and n}


def expected_length(rates: list[float], depth: int, counters: dict | None = None) -> float:
    """Tokens a request gains per step on average under unconditional per-position ``rates``: 1 + the rates
    of the positions drafted, at the profile's depth or, where dynamic-draft chose each step's depth, over
    the steps it ran at each (its counters)."""
    steps = depth_steps(counters)
    if not steps:
        steps = {depth: 1.0}
    return sum(n * (1.0 + sum(rates[:d])) for d, n in steps.items()) / sum(steps.values())


def add_expected(set_result: dict) -> None:
    """Each synthetic-acceptance row at B = 1 of ``set_result`` gains ``expected_acceptance_length`` and
    ``decode_tok_s_expected``: its measured step time at the profile's expected acceptance, in place.

    Why it was added: vLLM's synthetic sampler draws from a seeded generator, and a 64-token request at B = 1
    is 15-40 steps: on the H100 (eleventh session) stock@v2 drew a mean acceptance length of 4.33 every round
    where the rates expect 4.16 and the V1 sets drew 3.88-3.94 (prose: 2.17 against 1.91 and 1.66-1.80); the
    step time does not depend on the draws (the verification is k + 1 wide whatever is accepted). With a seed
    per round (twelfth session) the V1 sets still drew 3.67-3.94 with both seeds, so whether the gap is luck
    is not settled: this figure is reported beside the measured ratio, which is the one that decides.

    B = 1 only: there a request's steps are the engine's. With more requests the step time is the decode
    time over the *mean* steps per request, while the batch runs until its longest request ends, so it
    carries each engine's draws again (the straggler's length); pooled over B requests, the acceptance luck
    in the measured tok/s is small there (mean acceptance length within 3% of each other at B = 8 and 32
    in the same run)."""
    for row in set_result.get("results", []):
        label, ms = row.get("acceptance"), row.get("ms_per_step")
        if not label or not ms or row.get("batch") != 1:
            continue
        rates = [float(x) for x in label.split("/")]
        e = expected_length(rates, int(set_result.get("depth") or len(rates)), row.get("counters"))
        row["expected_acceptance_length"] = round(e, 3)
        row["decode_tok_s_expected"] = round(row["batch"] * e * 1e3 / ms, 1)


def ratio_cell(row: dict, key: str, unit: str = "x") -> str:
    """``1.05x``, with the rounds' ``[min-max]`` where the merged row has them; empty without the ratio."""
    if key not in row:
        return ""
    sp = row.get(f"{key}_spread")
    return f"{row[key]:.2f}{unit}" + (f" [{sp['min']:.2f}-{sp['max']:.2f}]" if sp else "")


def rounds_ran(set_result: dict) -> int:
    """The rounds a merged set ran in (a set that ran once keeps no ``rounds``)."""
    return len(set_result.get("rounds") or [set_result])


def set_label(set_result: dict, rounds: int) -> str:
    """The set's name, with how many of ``rounds`` it ran in where a run was cut short mid-round."""
    ran = rounds_ran(set_result)
    return set_result["set"] + (f" ({ran} of {rounds} rounds)" if ran < rounds else "")


def _spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def is_stock(s: dict, runner: str = "v1") -> bool:
    """Stock vLLM on ``runner``: the plugin off, the profile's draft depth, an engine that ran."""
    return not s.get("plugin") and s.get("runner") == runner and not s.get("depth_override") and "error" not in s


def reference(results: list[dict]) -> dict | None:
    """The set every ratio is taken against: stock vLLM on the runner vLLM itself picks where it ran
    (``stock@v2`` on a GPU: vLLM 0.32's default, what `vllm serve` gives a user), else stock on V1 (the
    only runner on a CPU; on a GPU the runner the plugin's sets use, so pairs differ by features only)."""
    return (next((s for s in results if is_stock(s, "v2")), None)
            or next((s for s in results if is_stock(s, "v1")), None))


def merge_rounds(rounds: list[list[dict]]) -> list[dict]:
    """One entry per set from ``rounds`` (each a list of set results in the same order; a round cut short
    holds the first sets only): the rows at the median of the rounds' decode tok/s, the spread of tok/s and
    of the within-round ratio to stock beside them (its ``n``: the rounds that set ran in), and every round's
    own result kept under ``rounds``."""
    merged: list[dict] = []
    for i, first in enumerate(rounds[0]):
        per_round = [r[i] for r in rounds if i < len(r)]
        ok = [s for s in per_round if "error" not in s]
        if not ok:
            merged.append({**per_round[-1], "rounds": per_round})
            continue
        out = {k: v for k, v in ok[-1].items() if k != "lossless"}
        out.update(rounds=per_round, results=[])
        checked = next((s["lossless"] for s in ok if "lossless" in s), None)  # re-scored in one round only
        if checked is not None:
            out["lossless"] = checked
        for row in ok[-1]["results"]:
            key = row_key(row)
            rows = [x for s in ok for x in s["results"] if row_key(x) == key]
            checked = next((x["lossless"] for x in rows if "lossless" in x), None)
            rows.sort(key=lambda x: x["decode_tok_s"])
            med = {k: v for k, v in rows[(len(rows) - 1) // 2].items() if k != "lossless"}  # a measured row
            if checked is not None:
                med["lossless"] = checked
            med["decode_tok_s_spread"] = _spread([x["decode_tok_s"] for x in rows])
            for key in ("vs_stock", "vs_stock_expected"):
                ratios = [x[key] for x in rows if key in x]
                med.pop(key, None)
                if ratios:
                    sp = _spread(ratios)
                    med[key], med[f"{key}_spread"] = sp["median"], sp
            out["results"].append(med)
        merged.append(out)
    return merged
