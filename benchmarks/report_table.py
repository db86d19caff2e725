"""The markdown table docs/benchmarks.md quotes, from a `radiance bench --rounds N` report, never edited:

    python benchmarks/report_table.py benchmarks/results/REPORT.json

Per set, acceptance profile and batch: the median decode tok/s of the rounds [min-max], the median of the
within-round ratios to the report's reference [min-max], and the same ratio at the profile's expected
acceptance (launcher.bench.rounds.add_expected: the measured step time, the synthetic sampler's luck left
out), with the measured and the expected mean acceptance length. The figures are recomputed from each
round's rows, so a report written before add_expected existed gets them too; a ``--keep-reference``
report's from its pairs (each set against the reference measurement taken just before it).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.bench import rounds, run  # noqa: E402


def rederive(report: dict) -> list[dict]:
    """The report's sets merged again from their rounds, with the expected-acceptance figures."""
    sets = report["sets"]
    if report["options"].get("keep_reference"):
        pairs = run.split_pairs(copy.deepcopy(sets))
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
            lines.append(f"| {name} | {r.get('acceptance', '')} | {r['batch']} | {tok} | {rounds.ratio_cell(r, 'vs_stock', '')} | "
                         f"{rounds.ratio_cell(r, 'vs_stock_expected', '')} | {r['ms_per_step']:.2f} | "
                         f"{acc if acc is not None else ''}{f' ({exp})' if exp is not None else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    print(f"<!-- {args.report.name}: {report.get('device')}, commit {report.get('commit')}, {report.get('date')}, "
          f"{report['options'].get('rounds_done')} rounds -->")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
