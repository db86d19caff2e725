"""Benchmark: host overhead of the dynamic-draft controller per decoding step (CPU).

Per step: ``begin`` with the matcher's continuations, one ``observe`` per MTP forward (fed from
an int32 [2, B] host array, token ids and the confidences' fp32 bits, as the hook receives it
from its one per-slot device-to-host copy, so the ``tolist`` conversions are counted),
``drafts`` and the telemetry update. Not counted: the copies
themselves and the forwards.

Scenarios: "deep" (every request confident, no n-gram, no cap: all k forwards, the worst case),
"schedule" (the default schedule caps forwards by batch size), "mixed" (random confidences and
n-gram agreement, the typical case).

    python benchmarks/bench_controller.py [--json out.json] [--batch 8] [--k 8]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from radiance.draft.controller import DraftPolicy, StepController  # noqa: E402
from radiance.draft.telemetry import DraftCounters  # noqa: E402


def make_steps(scenario, b, k, n, rng):
    steps = []
    for _ in range(n):
        toks = rng.integers(0, 4, (k, b)).astype(np.int32)
        if scenario == "deep":
            confs = np.ones((k, b), np.float32)
            cont = np.full((b, k), -1, np.int32)
            clen = np.zeros(b, np.int32)
        else:
            confs = rng.random((k, b)).astype(np.float32) ** 0.3
            cont = rng.integers(0, 4, (b, k)).astype(np.int32)
            clen = rng.integers(0, k + 1, b).astype(np.int32)
            if scenario == "schedule":
                confs[:] = 1.0
                clen[:] = 0
        # what one D2H brings per slot: int32 [2, B], token ids and the confidences' fp32 bits
        packed = [np.stack([toks[j], confs[j].view(np.int32)]) for j in range(k)]
        steps.append((cont, clen, packed))
    return steps


def run(ctl, counters, steps, k):
    for cont, clen, packed in steps:
        ctl.begin(k, cont.tolist(), clen.tolist())
        for j in range(k):
            a = packed[j]
            if ctl.observe(j, a[0].tolist(), a[1].view(np.float32).tolist()):
                break
        ctl.drafts()
        counters.record_step(ctl, k)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--batch", type=int, nargs="*", default=[1, 8, 32, 64])
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for scenario in ("deep", "schedule", "mixed"):
        for b in args.batch:
            policy = DraftPolicy() if scenario != "deep" else DraftPolicy(schedule=())
            ctl = StepController(policy)
            counters = DraftCounters()
            steps = make_steps(scenario, b, args.k, args.steps, rng)
            run(ctl, counters, steps[:50], args.k)  # warm-up
            per_step = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run(ctl, counters, steps, args.k)
                per_step.append((time.perf_counter() - t0) / len(steps) * 1e6)
            snap = counters.snapshot()
            rows.append({"scenario": scenario, "B": b, "k": args.k,
                         "us_median": statistics.median(per_step), "us_min": min(per_step),
                         "forwards_per_step": snap["mtp_forwards_run"] / snap["steps"]})
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "uncommitted"
    except OSError:
        commit = "unknown"
    cpu = platform.processor() or platform.machine()
    print(f"host: {cpu}, python {platform.python_version()}, load {os.getloadavg()[0]:.1f}")
    print(f"{'scenario':9s} {'B':>4s} {'k':>2s} {'us/step med':>12s} {'min':>8s} {'fwd/step':>9s}")
    for r in rows:
        print(f"{r['scenario']:9s} {r['B']:4d} {r['k']:2d} {r['us_median']:12.1f} "
              f"{r['us_min']:8.1f} {r['forwards_per_step']:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "controller", "host": cpu, "date": time.strftime("%Y-%m-%d"),
                       "commit": commit, "python": platform.python_version(),
                       "loadavg": os.getloadavg()[0], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
