"""benchmarks/bench_depth_policy_replay.py: its fixed depths reproduce the cost table it reads, and it runs
the policy of this tree and of another commit (pure Python, a few seconds)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("bench_depth_policy_replay",
                                                  ROOT / "benchmarks/bench_depth_policy_replay.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_fixed_depths_make_what_the_cost_table_says(replay):
    k, cost, profiles, batches, max_tokens = replay.cost_table(json.loads(replay.DEFAULT_COSTS.read_text()))
    assert k == 4 and batches == [1, 8, 32] and len(profiles) == 3 and len(cost) == 3 * 3 * 4
    runs = {d: replay.replay(lambda d=d: replay.Fixed(d), k, cost, profiles, batches, max_tokens, seed=0)
            for d in (1, 4)}
    # nothing accepted: every depth makes one token a step, so depth 1 wins by its shorter step
    for b in batches:
        want = cost[(2, b, 4)] / cost[(2, b, 1)]
        assert runs[1][(0, 2, b)] / runs[4][(0, 2, b)] == pytest.approx(want, rel=0.06), b
    # code-like at B = 1: depth 4 gains ~4.2 tokens a step to depth 1's ~1.9
    assert runs[4][(0, 0, 1)] > 1.5 * runs[1][(0, 0, 1)]


def test_a_second_round_in_the_same_engine_finds_the_deep_depths_again(replay):
    """`radiance bench --take-turns` keeps one engine per set: its second code-like phase comes after a phase
    that accepted nothing. Counted unconditionally, the policy then ran depth 1 there (the H100, twenty-first
    session: 0.56x-0.70x stock; this replay at seed 1, before: 0.75x)."""
    from radiance import features
    from radiance.draft.depth_policy import DepthPolicy

    k, cost, profiles, batches, max_tokens = replay.cost_table(json.loads(replay.DEFAULT_COSTS.read_text()))
    stock = replay.replay(lambda: replay.Fixed(k), k, cost, profiles, [1], max_tokens, seed=1, rounds=2)
    pol = replay.replay(lambda: DepthPolicy(k, tau=features.DRAFT_TAU), k, cost, profiles, [1], max_tokens,
                        seed=1, rounds=2)
    assert set(pol) == {(n, p, 1) for n in (0, 1) for p in range(3)}
    assert pol[(1, 0, 1)] > 0.9 * stock[(1, 0, 1)]


def test_the_cli_compares_this_tree_with_a_commit(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    if not head:
        pytest.skip("not a git checkout")
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_depth_policy_replay.py"), "--seeds", "1",
                           "--baseline", head, "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["kind"] == "depth_policy_replay" and "simulation" in doc["device"]
    assert set(doc["this_tree"]) == set(doc["baseline"]) - {"commit"} and len(doc["this_tree"]) == 9
    for cell in doc["this_tree"].values():
        assert 0.5 < cell["vs_best"]["mean"] < 1.1   # shared luck and jitter: a seed may beat the best
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench_depth_policy_replay.py"), "--seeds", "0"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--seeds" in bad.stderr
