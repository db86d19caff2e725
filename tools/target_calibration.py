"""Measure the gate's target check on a profile, feature set by feature set, on real vLLM.

    flock /tmp/radiance-vllm.lock python -m tools.target_calibration profiles/tiny-cpu.yaml \
        --record launcher/data/target/references/tiny-cpu.json --out benchmarks/results/target_tiny-cpu.json

1. ``--record PATH``: `radiance gate PROFILE --record-reference --output PATH` (the profile's engine started
   with its four features off), else the reference the profile already names;
2. each variant (stock again, draft-side features only, the profile as shipped, the shipped profile with
   int4-head's planted scale error of tests/e2e/plant_head_scale) is brought up with `radiance up
   --skip-gate`, gated once with `radiance gate --url` against that reference with no thresholds (the
   check is then informational and reports its numbers), and taken down.

Writes the figures as JSON (date, commit, the machine's CPU, one entry per variant) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from radiance.features import FEATURES

REPO = Path(__file__).resolve().parent.parent
PLANT = REPO / "tests" / "e2e" / "plant_head_scale"
DRAFT_SIDE = tuple(f.name for f in FEATURES if f.side == "draft")
TARGET_SIDE = tuple(f.name for f in FEATURES if f.side == "target")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commit() -> str:
    """HEAD, +dirty when the working tree (which the engines ran) differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True, capture_output=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, text=True,
                           capture_output=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _radiance(*args: str, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def _enabled(value) -> bool:
    return value.get("enabled", False) if isinstance(value, dict) else bool(value)


def variants(data: dict, scale_error: float) -> dict[str, dict]:
    """name -> (features turned off, extra engine env)."""
    on = [f for f, v in data.get("features", {}).items() if _enabled(v)]
    out = {"stock": {"off": on, "env": {}},
           "draft-side": {"off": [f for f in on if f not in DRAFT_SIDE], "env": {}},
           "shipped": {"off": [], "env": {}}}
    if "int4_head" in on and "fp8_stream" in on:
        out["shipped-without-int4-head"] = {"off": ["int4_head"], "env": {}}
    if "int4_head" in on:
        out["int4-head-damaged"] = {"off": [], "env": {"E2E_HEAD_SCALE_ERROR": str(scale_error),
                                                       "PYTHONPATH": str(PLANT)}}
    return out


def variant_profile(tmp: Path, data: dict, name: str, off: list[str], env: dict, reference: Path) -> Path:
    d = json.loads(json.dumps(data))
    d["name"] = f"{d['name']}-{name}"
    for f in off:
        d["features"][f] = False
    d.setdefault("env", {}).update(env)
    t = d.setdefault("gate", {}).setdefault("target", {})
    for k in ("max_nll_increase", "min_prefix_agreement", "min_full_agreement"):
        t.pop(k, None)
    t["reference"] = str(reference)
    path = tmp / f"{d['name']}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def measure(profile: Path, reference: Path, tmp: Path, env: dict, only: list[str] | None,
            scale_error: float) -> dict:
    data = yaml.safe_load(profile.read_text())
    out = {}
    for name, v in variants(data, scale_error).items():
        if only and name not in only:
            continue
        path = variant_profile(tmp, data, name, v["off"], v["env"], reference)
        port = _free_port()
        t0 = time.monotonic()
        up = _radiance("up", str(path), "--detach", "--skip-gate", "--port", str(port), env=env)
        t_up = time.monotonic() - t0
        try:
            if up.returncode != 0:
                out[name] = {"error": f"up exited {up.returncode}: {up.stdout[-400:]} {up.stderr[-400:]}"}
                continue
            t1 = time.monotonic()
            res = _radiance("gate", str(path), "--url", f"http://127.0.0.1:{port}", "--json",
                            "--reports-dir", str(tmp / "reports"), env=env)
            report = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {}
            check = next((c for c in report.get("checks", []) if c["name"] == "target"), {})
            m = check.get("metrics", {})
            out[name] = {"features_off": v["off"], "engine_env": sorted(v["env"]), "up_s": round(t_up, 1),
                         "gate_s": round(time.monotonic() - t1, 1), "status": check.get("status"),
                         "reason": check.get("reason"), "target_s": round(check.get("duration_s", 0.0), 1),
                         **{k: m.get(k) for k in ("mean_nll", "reference_mean_nll", "nll_increase",
                                                  "prefix_agreement", "full_agreement", "prompts_identical",
                                                  "prompts", "held_tokens")},
                         "first_difference": [p["prefix_tokens"] for p in m.get("per_prompt", [])]}
        finally:
            _radiance("down", data["name"] + "-" + name, env=env, timeout=300)
        print(json.dumps({name: out[name]}), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--record", type=Path, default=None, help="record the reference here first")
    ap.add_argument("--reference", type=Path, default=None, help="use this reference (default: --record's)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None, help="variants to run (stock, draft-side, shipped, "
                                                            "shipped-without-int4-head, int4-head-damaged)")
    ap.add_argument("--scale-error", type=float, default=2.0)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="radiance-target-cal-"))
    env = {**os.environ, "RADIANCE_HOME": str(tmp / "state"), "PYTHONUNBUFFERED": "1"}
    env.setdefault("RADIANCE_CACHE_DIR", str(REPO / ".cache" / "radiance"))
    result: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "commit": _commit(),
                    "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                    "profile": str(args.profile), "scale_error": args.scale_error}
    reference = args.reference or args.record
    if args.record:
        t0 = time.monotonic()
        rec = _radiance("gate", str(args.profile), "--record-reference", "--output", str(args.record), "--json",
                        env=env)
        if rec.returncode != 0:
            print(rec.stdout, rec.stderr, file=sys.stderr)
            return rec.returncode
        result["recorded"] = {**json.loads(rec.stdout), "seconds": round(time.monotonic() - t0, 1)}
        print(json.dumps(result["recorded"]), flush=True)
    if reference is None:
        ap.error("give --record or --reference")
    result["variants"] = measure(args.profile, reference.resolve(), tmp, env, args.only, args.scale_error)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'variant':<20} {'NLL':>8} {'vs stock':>9} {'prefix':>7} {'identical':>9}  status")
    for name, v in result["variants"].items():
        if "error" in v:
            print(f"{name:<20} {v['error']}")
            continue
        print(f"{name:<20} {v['mean_nll'] or 0:8.4f} {v['nll_increase'] or 0:+9.4f} {v['prefix_agreement'] or 0:7.3f} "
              f"{v['prompts_identical']}/{v['prompts']:<7}  {v['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
