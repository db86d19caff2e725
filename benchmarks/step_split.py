"""Where a timed run's decode time went, per step: waiting on the GPU or on the host. From a `radiance bench`
report and vLLM's per-step lines kept beside it (`--vllm-arg enable-logging-iteration-details=true`; the device
script's table keeps them as `steps-SET.log.gz`, committed as `REPORT.steps-SET.log.gz`):

    python benchmarks/step_split.py benchmarks/results/REPORT.json [--json]

Under asynchronous scheduling vLLM's "iteration elapsed time" is how long the engine core blocked on a step's
result (`vllm/v1/engine/core.py`, `step_with_batch_queue`), which is the GPU's share the host could not hide.
A timed run's decode time (its wall time less the first-token run's) less the sum of those waits over its
decode steps is the host's share: the scheduler, the output's processing, and whatever of the run's prefill
the first-token run did not match. Per set, acceptance profile and batch, the table gives both per decode
step, averaged over the rounds (docs/benchmarks.md, twenty-third session, quotes it).

Each cell's lines are read in the order the bench ran them: an untimed run, the timed one, then the
first-token runs (prefill only); so this needs `--repeat 1`.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

_CELL = re.compile(r"^radiance bench: (\S+) B=(\d+)(?: at (\S+?))?: ")
_STEP = re.compile(r"(\d+) context requests, \d+ context tokens, \d+ generation requests, \d+ generation "
                   r"tokens, iteration elapsed time: ([\d.]+) ms")


def read_cells(lines, step=_STEP, fields=(int, float)) -> dict[str, list[tuple[int, str | None, list[tuple]]]]:
    """Per set, its cells in the order measured: (batch, acceptance label, [one tuple per step line]); each
    tuple is ``step``'s groups read by ``fields`` (by default: context requests, wait ms)."""
    cells: dict[str, list] = {}
    steps: list[tuple] = []
    for line in lines:
        m = _CELL.match(line)
        if m:
            cells.setdefault(m.group(1), []).append((int(m.group(2)), m.group(3), steps))
            steps = []
            continue
        m = step.search(line)
        if m:
            steps.append(tuple(f(g) for f, g in zip(fields, m.groups())))
    return cells


def timed_run(steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The second run of a cell: a run begins with a prefill step after a decode step."""
    runs: list[list] = [[]]
    for step in steps:
        if step[0] > 0 and runs[-1] and runs[-1][-1][0] == 0:
            runs.append([])
        runs[-1].append(step)
    if len(runs) < 2:
        raise ValueError("a cell without a timed run after its untimed one")
    return runs[1]


def split(report: dict, cells: dict[str, list]) -> list[dict]:
    """One row per set, acceptance and batch: mean wait / host / total ms per decode step over the rounds."""
    if report.get("options", {}).get("repeat", 1) != 1:
        raise ValueError("the per-step split needs a report run with --repeat 1")
    rows = []
    for s in report["sets"]:
        name = s["set"]
        measured = [r for rd in s.get("rounds", []) for r in rd["results"]]
        logged = cells.get(name, [])
        if len(measured) != len(logged):
            raise ValueError(f"{name}: {len(measured)} rows in the report, {len(logged)} cells in its step lines")
        acc: dict[tuple, list] = {}
        for row, (batch, label, steps) in zip(measured, logged):
            if row["batch"] != batch or row.get("acceptance") != label:
                raise ValueError(f"{name}: the report's B={row['batch']} at {row.get('acceptance')} "
                                 f"is logged as B={batch} at {label}")
            decode = [wait for ctx, wait in timed_run(steps) if ctx == 0]
            decode_ms = 1e3 * (row["wall_s"] - row["first_token_s"])
            acc.setdefault((label, batch), []).append((sum(decode) / len(decode), decode_ms / len(decode)))
        for (label, batch), v in acc.items():
            wait, total = (sum(x[i] for x in v) / len(v) for i in (0, 1))
            rows.append({"set": name, "acceptance": label, "batch": batch, "rounds": len(v), "wait_ms": round(wait, 1),
                         "host_ms": round(total - wait, 1), "total_ms": round(total, 1)})
    return rows


def load(report_path: Path, read=read_cells) -> tuple[dict, dict]:
    """The report and, per set, its cells from the step lines beside it (``read``: how a log's lines become cells)."""
    report = json.loads(report_path.read_text())
    cells: dict[str, list] = {}
    for f in sorted(report_path.parent.glob(report_path.stem + ".steps-*.log.gz")):
        with gzip.open(f, "rt") as fh:
            for name, found in read(fh).items():
                cells.setdefault(name, []).extend(found)
    if not cells:
        raise ValueError(f"no step lines beside {report_path} ({report_path.stem}.steps-SET.log.gz)")
    return report, cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    args = ap.parse_args(argv)
    try:
        rows = split(*load(args.report))
    except (OSError, ValueError) as exc:
        print(f"step_split: {args.report}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| set | acceptance | B | rounds | waited on the GPU ms/step | host ms/step | total ms/step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['set']} | {r['acceptance']} | {r['batch']} | {r['rounds']} | {r['wait_ms']} | {r['host_ms']} "
              f"| {r['total_ms']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
