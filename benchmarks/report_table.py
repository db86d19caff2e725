"""The markdown table docs/benchmarks.md quotes, from a `radiance bench --rounds N` report, never edited:

    python benchmarks/report_table.py benchmarks/results/REPORT.json

Per set, acceptance profile and batch: the median decode tok/s of the rounds [min-max], the median of the
within-round ratios to the report's reference [min-max], and the same ratio at the profile's expected
acceptance (launcher.bench.rounds.add_expected: the measured step time, the synthetic sampler's luck left
out), with the measured and the expected mean acceptance length. The figures are recomputed from each
round's rows, so a report written before add_expected existed gets them too; a ``--keep-reference``
report's from its pairs (each set against the reference measurement taken just before it).

Where the report ran fixed depths (``stock`` and ``stock/kN``) beside dynamic-draft, a second table puts each
dynamic-draft set against the best fixed depth of the same report, per acceptance profile and batch, with the
depths it ran (steps at each, from its counters): issue 37's fourth point.

``--drop ROUND:ACCEPTANCE`` (repeatable) leaves out, in every set, the rows of that round (1-based) at that
acceptance profile, before the medians are taken: for rows a known fault ran at something other than what
they are labelled (the twenty-first session's first round after a wake ran its first profile at acceptance 0).
The raw JSON keeps them, and the table's header line names what was left out.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.bench import rounds, run  # noqa: E402


def drop_rows(report: dict, drops: list[tuple[int, str]]) -> dict:
    """A copy of ``report`` without, in every set, the rows of round N (1-based) at acceptance A, for each
    (N, A) in ``drops``. ValueError where a pair matches no row: a misspelt profile must not pass unseen."""
    report = copy.deepcopy(report)
    for n, acceptance in drops:
        hit = False
        for s in report["sets"]:
            runs = s.get("rounds") or [s]
            if n - 1 < len(runs):
                kept = [r for r in runs[n - 1]["results"] if r.get("acceptance") != acceptance]
                hit |= len(kept) < len(runs[n - 1]["results"])
                runs[n - 1]["results"] = kept
        if not hit:
            raise ValueError(f"--drop {n}:{acceptance}: no set has rows of round {n} at that acceptance")
    return report


def rederive(report: dict) -> list[dict]:
    """The report's sets merged again from their rounds, with the expected-acceptance figures."""
    sets = report["sets"]
    if report["options"].get("keep_reference"):
        pairs = run.split_pairs(copy.deepcopy(sets), shared_reference=bool(report["options"].get("take_turns")))
        for pair in (p for ps in pairs.values() for p in ps):
            for s in pair:
                rounds.add_expected(s)
        return run.merge_pairs(pairs)
    # a round cut short holds the sets it reached, in order (run.merge_done)
    done = [[copy.deepcopy((s.get("rounds") or [s])[i]) for s in sets if i < rounds.rounds_ran(s)]
            for i in range(max(map(rounds.rounds_ran, sets)))]
    for one in done:
        for s in one:
            rounds.add_expected(s)
    return run.merge_done(done)[0]


def markdown(report: dict) -> str:
    ref = report.get("reference") or "stock"
    lines = [f"| set | acceptance | B | decode tok/s [min-max] | vs {ref} | vs {ref} at expected acceptance | "
             "ms/step | accept len (expected) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    merged = rederive(report)
    # the rounds asked for, as the CLI's table counts them (a reference kept loaded ran once per pair)
    n = report["options"].get("rounds") or max(map(rounds.rounds_ran, merged))
    for s in merged:
        name = rounds.set_label(s, n)
        if "error" in s:
            lines.append(f"| {name} | error: {s['error'][:60]} | | | | | | |")
            continue
        for r in s["results"]:
            sp = r.get("decode_tok_s_spread")
            tok = f"{r['decode_tok_s']:.0f}" + (f" [{sp['min']:.0f}-{sp['max']:.0f}]" if sp else "")
            acc = r.get("mean_acceptance_length")
            exp = r.get("expected_acceptance_length")
            lines.append(f"| {name} | {r.get('acceptance', '')} | {r['batch']} | {tok} | "
                         f"{rounds.ratio_cell(r, 'vs_stock', '')} | "
                         f"{rounds.ratio_cell(r, 'vs_stock_expected', '')} | {r['ms_per_step']:.2f} | "
                         f"{acc if acc is not None else ''}{f' ({exp})' if exp is not None else ''} |")
    return "\n".join(lines)


def _depth_steps(row: dict) -> str:
    return ", ".join(f"{d}: {n:.0f}" for d, n in sorted(rounds.depth_steps(row.get("counters")).items()))


def _tok(row: dict) -> str:
    sp = row.get("decode_tok_s_spread")
    reps = row.get("decode_tok_s_repeats")
    lo_hi = (sp["min"], sp["max"]) if sp else (min(reps), max(reps)) if reps else None
    return f"{row['decode_tok_s']:.0f}" + (f" [{lo_hi[0]:.0f}-{lo_hi[1]:.0f}]" if lo_hi else "")


def depth_table(report: dict) -> str | None:
    """Each dynamic-draft set against every fixed depth the report ran and the best of them, per acceptance
    profile and batch; None where the report has no dynamic-draft set or fewer than two fixed depths. The
    spread is the rounds' where there were rounds, else the repeats' within the one engine."""
    merged = [s for s in rederive(report) if "error" not in s]
    fixed = {int(s["depth"]): s for s in merged if not s.get("features") and s.get("depth")}
    dynamic = [s for s in merged if "dynamic_draft" in (s.get("features") or [])]
    if not dynamic or len(fixed) < 2:
        return None
    depths = sorted(fixed)
    stock = max(depths)   # what the profile configures; stock/kN only ever goes shallower
    head = " | ".join(f"k{d}" + (" (stock)" if d == stock else "") for d in depths)
    lines = [f"| set | acceptance | B | {head} | best fixed | dynamic-draft [spread] | vs best fixed | vs stock | "
             "depths run (steps) |", "|---|---|---:|" + "---:|" * (len(depths) + 4) + "---|"]
    rows = {d: {rounds.row_key(r): r for r in s["results"]} for d, s in fixed.items()}
    for s in dynamic:
        for r in s["results"]:
            key = rounds.row_key(r)
            tok = {d: rows[d][key]["decode_tok_s"] for d in depths if key in rows[d]}
            if stock not in tok:
                continue
            best = max(tok, key=tok.get)
            cells = " | ".join(f"{tok[d]:.0f}" if d in tok else "" for d in depths)
            lines.append(f"| {s['set']} | {r.get('acceptance', '')} | {r['batch']} | {cells} | k{best} | {_tok(r)} | "
                         f"{r['decode_tok_s'] / tok[best]:.2f} | {r['decode_tok_s'] / tok[stock]:.2f} | "
                         f"{_depth_steps(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--drop", action="append", default=[], metavar="ROUND:ACCEPTANCE",
                    help="leave out every set's rows of that round at that acceptance profile (repeatable)")
    args = ap.parse_args(argv)
    drops = []
    for d in args.drop:
        n, sep, acceptance = d.partition(":")
        if not sep or not n.isdigit() or int(n) < 1 or not acceptance:
            ap.error(f"--drop {d}: expected ROUND:ACCEPTANCE, e.g. 1:0.908/0.824/0.748/0.679")
        drops.append((int(n), acceptance))
    report = json.loads(args.report.read_text())
    try:
        report = drop_rows(report, drops)
    except ValueError as exc:
        ap.error(str(exc))
    dropped = "".join(f", round {n} at {a} left out" for n, a in drops)
    print(f"<!-- {args.report.name}: {report.get('device')}, commit {report.get('commit')}, {report.get('date')}, "
          f"{report['options'].get('rounds_done')} rounds{dropped} -->")
    print(markdown(report))
    depths = depth_table(report)
    if depths:
        print()
        print(depths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
