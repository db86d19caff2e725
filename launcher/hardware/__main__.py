"""``python -m launcher.hardware [--json] [--root DIR] [--timeout S]``: print the probe report.

Standard library only, so it runs inside a target image before anything else is installed.
Exit code 0 whenever the probe ran (an empty machine is a valid answer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import probe_all


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.hardware", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to read (a captured tree)")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds per external probe command")
    args = ap.parse_args(argv)
    report = probe_all(args.root, args.timeout)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"platform: {report.platform}")
    for g in report.gpus:
        free = f", {g.memory_free_gib:.1f} GiB free" if g.memory_free_gib is not None else ""
        print(f"  {g.label()}: {g.memory_total_gib:.1f} GiB{free} [{g.source}]")
    for p in report.probes:
        print(f"  probe {p.name}: {p.status}" + (f" - {p.detail}" if p.detail else ""))
    for w in report.warnings:
        print(f"warning: {w}")
    for p in report.problems:
        print(f"problem: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
