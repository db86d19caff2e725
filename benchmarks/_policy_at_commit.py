"""The depth policy of another commit, loaded from git beside this tree's, for the policy benchmarks
(bench_depth_policy_sim.py, bench_depth_policy_replay.py)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def draft_module_at(commit: str, name: str, overrides: dict | None = None):
    """``radiance/draft/<name>.py`` as it was at ``commit``. Its relative imports resolve in this tree;
    ``overrides`` then replaces names in its namespace (the commit's estimator, say)."""
    src = subprocess.run(["git", "show", f"{commit}:radiance/draft/{name}.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(f"radiance.draft._{name}_{commit}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "radiance.draft"
    sys.modules[spec.name] = mod   # dataclasses look their module up
    exec(compile(src, f"{commit}:{name}.py", "exec"), mod.__dict__)
    mod.__dict__.update(overrides or {})
    return mod


def policy_at(commit: str):
    """The commit's DepthPolicy on the commit's AcceptanceEstimate."""
    acc = draft_module_at(commit, "acceptance")
    return draft_module_at(commit, "depth_policy", {"AcceptanceEstimate": acc.AcceptanceEstimate}).DepthPolicy
