"""dynamic-draft's depth policy replayed through `radiance bench`'s order on a measured cost table.

    python benchmarks/bench_depth_policy_replay.py [--costs RESULT.json] [--baseline COMMIT] [--seeds 20]
                                                   [--rounds 1] [--json OUT.json]

A simulation, not a measurement: it says what the policy (radiance/draft/depth_policy.py and acceptance.py)
decides when the steps cost what a GPU run measured, not what a GPU does. What it replays, in one engine
whose policy state carries over from run to run as in `radiance bench`:

- for each acceptance profile of the cost table, one untimed run at the largest batch, then per batch one
  untimed run and ``REPEATS`` timed ones; every request asks for the table's max_tokens; ``--rounds N``
  does it N times over in the same engine, as `radiance bench --take-turns` keeps one engine per set
  (each round's cells reported apart: a later round meets the policy the earlier ones left);
- a step's cost is the table's ms/step for (acceptance profile, batch of the run, depth), from the fixed-depth
  sets (``stock/kN``; ``stock`` is the configured depth), times a per-step and a per-run log-normal factor;
- each request draws its acceptance per step from the profile's unconditional per-position rates (position i
  accepted given i - 1 with r_i / r_(i-1)); the draws of a request are the same whatever depth runs, so the
  policy and every fixed depth meet the same luck;
- the policy runs with the shipped tau (``features.DRAFT_TAU``) and no batch-size schedule;
- the policy hears of a step one step late (asynchronous scheduling: the next step is chosen before the last
  one's output is back); the first step of a run is a prefill (not clean).

Efficiency per cell: the median of the timed runs' tokens per second, over the best fixed depth's median in
the same seed. The table prices every step of a run at its batch's mean ms/step, also steps where fewer
requests are left, so absolute tok/s run below the measured ones; ratios are what to read.
``--baseline`` replays a commit's policy and estimator (git show) beside this tree's.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _policy_at_commit import policy_at  # noqa: E402
from launcher.bench.rounds import acceptance_label  # noqa: E402  (how the cost table names a profile)
from radiance import features  # noqa: E402
from radiance.draft import depth_policy  # noqa: E402

DEFAULT_COSTS = ROOT / "benchmarks/results/vllm_27b_shape_h100_2026-12-06_s15_dynamic_draft_v2_fixed_depths.json"
REPEATS = 3
STEP_JITTER = 0.05   # sigma of a step's log-normal cost factor
RUN_JITTER = 0.04    # sigma of a run's


def cost_table(doc: dict) -> tuple[int, dict, list[list[float]], list[int], int]:
    """(configured depth, {(profile, batch, depth): seconds per step}, profiles, batches, max_tokens)
    from a `radiance bench` result with stock and its stock/kN sets."""
    profiles = doc["acceptance"]["profiles"]
    names = [acceptance_label(p) for p in profiles]
    sets = {s["set"]: s for s in doc["sets"]}
    if "stock" not in sets:
        raise ValueError("no `stock` set")
    k = int(max(r["draft_tokens_per_step"] for r in sets["stock"]["results"]))
    cost = {}
    for name, depth in [("stock", k)] + [(f"stock/k{d}", d) for d in range(1, k)]:
        if name not in sets:
            raise ValueError(f"no `{name}` set (the replay needs every fixed depth 1..{k})")
        for r in sets[name]["results"]:
            cost[(names.index(r["acceptance"]), r["batch"], depth)] = r["ms_per_step"] / 1000.0
    return k, cost, profiles, list(doc["options"]["batches"]), int(doc["options"]["max_tokens"])


class Fixed:
    """A fixed depth, asked the policy's question."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def choose(self, batch_size: int):
        return depth_policy.Decision(self.depth, False)

    def observe(self, *args, **kwargs) -> None:
        pass


class Replay:
    def __init__(self, policy, k: int, cost: dict, profiles: list, seed: int) -> None:
        self.policy, self.k, self.cost, self.profiles, self.seed = policy, k, cost, profiles, seed
        self.now = 0.0
        self.pending = None   # the last step's output, not yet back at the scheduler
        self.depths: list[int] = []

    def run(self, profile: int, batch: int, max_tokens: int, run_id: int) -> float:
        """One run of ``batch`` requests; decode tokens per second."""
        rates = self.profiles[profile]
        cond = [rates[0]] + [rates[i] / rates[i - 1] if rates[i - 1] > 0 else 0.0 for i in range(1, self.k)]
        luck = [random.Random(f"{self.seed}/{run_id}/{r}") for r in range(batch)]
        run_rng = random.Random(f"{self.seed}/{run_id}/run")
        step_rng = random.Random(f"{self.seed}/{run_id}/steps")
        factor = run_rng.lognormvariate(0.0, RUN_JITTER)
        made = [0] * batch
        start, first = self.now, True
        while True:
            active = [r for r in range(batch) if made[r] < max_tokens]
            if not active:
                break
            d = self.policy.choose(len(active)).depth
            self.depths.append(d)
            if self.pending is not None:
                self.policy.observe(*self.pending)
            self.now += self.cost[(profile, batch, d)] * factor * step_rng.lognormvariate(0.0, STEP_JITTER)
            drafted, accepted = [], []
            for r in range(batch):
                draws = [luck[r].random() for _ in range(self.k)]   # every depth meets the same luck
                if made[r] >= max_tokens:
                    continue
                a = 0
                while a < d and draws[a] < cond[a]:
                    a += 1
                made[r] += 1 if first else 1 + a
                drafted.append(0 if first else d)
                accepted.append(0 if first else a)
            self.pending = (self.now, len(active), drafted, accepted, d, not first)
            first = False
        if self.pending is not None:
            self.policy.observe(*self.pending)
            self.pending = None
        self.now += 0.5   # between runs: an idle gap, which the policy's outlier rule drops
        return sum(made) / (self.now - 0.5 - start)


def replay(make_policy, k, cost, profiles, batches, max_tokens, seed, rounds=1) -> dict:
    """`radiance bench`'s order in one engine, ``rounds`` times; the timed runs' tok/s per (round, profile,
    batch)."""
    rp = Replay(make_policy(), k, cost, profiles, seed)
    out, run_id = {}, 0
    for n, p in ((n, p) for n in range(rounds) for p in range(len(profiles))):
        rp.run(p, max(batches), max_tokens, run_id)
        run_id += 1
        for b in batches:
            rp.run(p, b, max_tokens, run_id)
            run_id += 1
            timed = []
            for _ in range(REPEATS):
                timed.append(rp.run(p, b, max_tokens, run_id))
                run_id += 1
            out[(n, p, b)] = statistics.median(timed)
    return out


def table(policy_cls, k, cost, profiles, batches, max_tokens, seeds, rounds=1) -> dict:
    cells: dict = {}
    for seed in range(seeds):
        fixed = {d: replay(lambda d=d: Fixed(d), k, cost, profiles, batches, max_tokens, seed, rounds)
                 for d in range(1, k + 1)}
        pol = replay(lambda: policy_cls(k, tau=features.DRAFT_TAU), k, cost, profiles, batches, max_tokens, seed,
                     rounds)
        for cell, tok_s in pol.items():
            best = max(fixed[d][cell] for d in fixed)
            c = cells.setdefault(cell, {"vs_best": [], "vs_stock": []})
            c["vs_best"].append(tok_s / best)
            c["vs_stock"].append(tok_s / fixed[k][cell])
    return {(f"round {n + 1} " if rounds > 1 else "") + f"{acceptance_label(profiles[p])} B={b}":
            {key: {"mean": round(statistics.mean(v), 3), "min": round(min(v), 3)} for key, v in c.items()}
            for (n, p, b), c in cells.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--costs", default=str(DEFAULT_COSTS), help="a `radiance bench` result with stock/kN sets")
    ap.add_argument("--baseline", help="a commit whose policy and estimator replay beside this tree's")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1, help="the profiles this many times over in one engine")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    if a.seeds < 1 or a.rounds < 1:
        ap.error("--seeds and --rounds must be at least 1")
    try:
        src = json.loads(Path(a.costs).read_text())
        k, cost, profiles, batches, max_tokens = cost_table(src)
    except (OSError, ValueError, KeyError) as exc:
        ap.error(f"{a.costs}: {exc} — fix: --costs a `radiance bench` result with stock and stock/kN sets")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {"kind": "depth_policy_replay", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": commit, "device": f"cpu ({platform.machine()}), simulation",
           "costs": {"file": str(Path(a.costs).resolve().relative_to(ROOT)) if Path(a.costs).resolve()
                     .is_relative_to(ROOT) else a.costs, "device": src.get("device"), "commit": src.get("commit")},
           "seeds": a.seeds, "rounds": a.rounds, "repeats": REPEATS, "step_jitter": STEP_JITTER, "run_jitter": RUN_JITTER,
           "this_tree": table(depth_policy.DepthPolicy, k, cost, profiles, batches, max_tokens, a.seeds, a.rounds)}
    if a.baseline:
        doc["baseline"] = {"commit": a.baseline, **table(policy_at(a.baseline), k, cost, profiles, batches,
                                                         max_tokens, a.seeds, a.rounds)}
    for key, row in doc["this_tree"].items():
        base = doc.get("baseline", {}).get(key)
        was = (f"   baseline: vs best {base['vs_best']['mean']:.3f} (min {base['vs_best']['min']:.3f})"
               if base else "")
        print(f"{key:42} vs best {row['vs_best']['mean']:.3f} (min {row['vs_best']['min']:.3f})  "
              f"vs stock {row['vs_stock']['mean']:.3f}{was}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
