"""dynamic-draft's depth policy in simulation: what it makes per second against the best fixed depth.

    python benchmarks/bench_depth_policy_sim.py [--baseline COMMIT] [--seeds 20] [--json OUT.json]

The engine is the unit tests' (tests/radiance/draft/test_depth_policy.py): a step drafting d costs a fixed
time per depth (the verification is k every step), each draft position is accepted at its unconditional
rate, and every step's time is multiplied by a seeded log-normal factor (host jitter). Each case runs 300
steps at B = 8; the first 20 are left out. Efficiency = tokens per noiseless second made, over the best fixed
depth's. ``--baseline`` runs the same on the policy of another commit (its radiance/draft/depth_policy.py,
read with git show), beside this tree's. No GPU: this is what the policy decides, not what a GPU runs.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests" / "radiance" / "draft")]

from _policy_at_commit import draft_module_at  # noqa: E402  (its estimator stays this tree's)
from radiance.draft import depth_policy  # noqa: E402
from test_depth_policy import JitteryEngine, tokens_per_s  # noqa: E402

# (step cost per depth in s, per-position acceptance). The 27B rows: the tenth session's H100 table at B = 32
# (depth 1 timed at acceptance 0, depth 4 as stock), depths 2 and 3 on the line between; B = 1 likewise.
CASES = {
    "tiny B=8 (ninth session)": ({1: 0.0125, 2: 0.0130, 3: 0.0138, 4: 0.0145}, [0.675, 0.535, 0.433, 0.31]),
    "shallow depth worth +17%": ({1: 0.020, 2: 0.024, 3: 0.030, 4: 0.036}, [0.71, 0.50, 0.36, 0.26]),
    "27B B=32 code-like": ({1: 0.032, 2: 0.0345, 3: 0.037, 4: 0.042}, [0.908, 0.824, 0.748, 0.679]),
    "27B B=32 prose-like": ({1: 0.032, 2: 0.0345, 3: 0.037, 4: 0.042}, [0.492, 0.242, 0.119, 0.058]),
    "27B B=32 acceptance 0": ({1: 0.032, 2: 0.0345, 3: 0.037, 4: 0.042}, [0.0, 0.0, 0.0, 0.0]),
    "27B B=1 code-like": ({1: 0.0227, 2: 0.0237, 3: 0.0248, 4: 0.0258}, [0.908, 0.824, 0.748, 0.679]),
}
SIGMAS = (0.1, 0.3)


def _efficiency(policy_cls, cost, rates, sigma, seed, steps=300):
    eng = JitteryEngine(policy_cls(4), cost, rates, sigma, seed)
    for _ in range(steps):
        eng.step(8)
    tail = eng.chosen[20:]
    made = sum(1 + sum(rates[:d]) for d in tail) / sum(cost[d] for d in tail)
    return made / max(tokens_per_s(cost, rates, d) for d in range(1, 5))


def _table(policy_cls, seeds: int) -> dict:
    out = {}
    for name, (cost, rates) in CASES.items():
        for sigma in SIGMAS:
            e = [_efficiency(policy_cls, cost, rates, sigma, s) for s in range(seeds)]
            out[f"{name}, jitter {sigma}"] = {"min": round(min(e), 3), "mean": round(sum(e) / len(e), 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="a commit whose policy runs beside this tree's")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {"kind": "depth_policy_sim", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": commit, "device": f"cpu ({platform.machine()}), simulation", "seeds": a.seeds,
           "steps": 300, "batch": 8, "cases": {k: {"cost_s": c, "rates": r} for k, (c, r) in CASES.items()},
           "this_tree": _table(depth_policy.DepthPolicy, a.seeds)}
    if a.baseline:
        baseline = draft_module_at(a.baseline, "depth_policy").DepthPolicy
        doc["baseline"] = {"commit": a.baseline, **_table(baseline, a.seeds)}
    for key, row in doc["this_tree"].items():
        base = doc.get("baseline", {}).get(key)
        was = f"   (baseline min {base['min']:.3f} mean {base['mean']:.3f})" if base else ""
        print(f"{key:40} min {row['min']:.3f} mean {row['mean']:.3f}{was}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
