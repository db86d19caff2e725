"""`radiance bench`'s driver: one engine per feature set, each in a fresh process, results as one report.

Each set's engine gets exactly what `radiance up` would give it (``engine_args.build``: the same flags and
``RADIANCE_*`` environment, with the set's features on), so what is timed is what is served. A set whose
engine fails is reported with its error and the last lines of its log; the others still run.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import console, engine_args, paths, procs
from ..profile import Profile
from ..runtime.base import EngineHandle
from ..runtime.local import LocalEngine
from . import plan, rounds, synthetic_rates
from .lossless import DEFAULT_EPS


def prompt_texts(n: int) -> list[str]:
    """The gate's acceptance prompts (code, JSON, prose), then GSM8K test questions: n distinct texts."""
    from ..gate import gsm8k
    from ..gate.acceptance import load_prompt_set

    # the chat-formatted prompts need a template: plain text only
    texts = [p.prompt for p in load_prompt_set("v1").prompts if p.prompt is not None]
    questions = gsm8k.load(None, 0).test
    texts += ["Question: " + q["question"] + "\nAnswer:" for q in questions[:max(0, n - len(texts))]]
    return texts[:max(n, 1)]


@dataclass
class Options:
    batches: list[int]
    max_tokens: int
    prompt_tokens: int = 0
    repeat: int = 1
    lossless_batches: list[int] = field(default_factory=list)
    eps: float = DEFAULT_EPS
    engine_env: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 1800.0
    # vLLM's synthetic rejection sampler (rounds.py): each profile's rates in turn, in one engine per set
    acceptance: list[list[float]] | None = None
    rounds: int = 1                        # every set once per round, rounds one after another


def engine_env(fs: plan.FeatureSet, cfg_env: dict[str, str], platform: str) -> dict[str, str]:
    env = dict(cfg_env)
    if not fs.plugin:
        env["RADIANCE_ENABLE"] = "0"
    if platform != "cpu":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if fs.runner == "v2" else "0"
    return env


def run_set(fs: plan.FeatureSet, profile: Profile, platform: str, opts: Options, log_dir: Path,
            log_suffix: str = "") -> dict:
    p = plan.for_set(profile, fs)
    cfg = engine_args.from_profile(p, platform=platform)
    server_args = cfg.server_args
    if opts.acceptance:
        server_args = rounds.with_synthetic_acceptance(server_args, opts.acceptance[0])
        if len(opts.acceptance) > 1:
            server_args = synthetic_rates.with_extension(server_args)
    env = dict(os.environ)
    env.update(engine_env(fs, cfg.env, platform))
    env.update(opts.engine_env)
    env.update(cfg.secret_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    job = {"set": fs.name, "server_args": server_args, "batches": opts.batches, "max_tokens": opts.max_tokens,
           "prompt_tokens": opts.prompt_tokens, "repeat": opts.repeat, "eps": opts.eps,
           "lossless_batches": opts.lossless_batches, "prompts": prompt_texts(max(opts.batches)),
           "acceptance": opts.acceptance}
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{fs.name.replace('@', '-').replace('+', '_').replace('/', '-')}{log_suffix}.log"
    with tempfile.TemporaryDirectory(prefix="radiance-bench-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        procs.become_subreaper()
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            log.write(f"[radiance] bench set {fs.name}: {cfg.redacted_command()}\n".encode())
            log.flush()
            proc = subprocess.Popen([sys.executable, "-m", "launcher.bench.worker", str(job_path), str(out_path)],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
            try:
                proc.wait(timeout=opts.timeout_s)
            except subprocess.TimeoutExpired:
                pass
            finally:
                # The worker's engine core and workers go with it, whatever state it left them in, also
                # when this process is interrupted.
                LocalEngine().stop(EngineHandle(runtime="local", ident=str(proc.pid), spec=None), timeout=20.0)
        result = json.loads(out_path.read_text()) if out_path.exists() else {
            "set": fs.name, "error": f"no result after {time.monotonic() - t0:.0f} s (timeout {opts.timeout_s:.0f} s)"}
    result.update(features=list(fs.features), plugin=fs.plugin, runner=fs.runner, depth=p.drafter.num_speculative_tokens,
                  depth_override=fs.depth is not None,
                  log=str(log_path),
                  knobs={k: v for k, v in sorted(env.items())
                         if k.startswith("RADIANCE_") or k == "VLLM_USE_V2_MODEL_RUNNER"})
    if "error" in result:
        result["log_tail"] = log_path.read_text(errors="replace").splitlines()[-15:]
    return result


def bench(profile: Profile, profile_path: str, platform: str, sets: list[plan.FeatureSet], opts: Options,
          commit: str, log_dir: Path, on_set=None) -> dict:
    """Every set once per round, ``opts.rounds`` rounds in a row (stock, set, stock, set, ...); the outputs
    are re-scored in the first round only. ``on_set(report)`` after each set: a long run that is cut short
    keeps what it measured."""
    started = dt.datetime.now(dt.timezone.utc)
    done: list[list[dict]] = []
    for n in range(1, opts.rounds + 1):
        round_opts = opts if n == 1 else replace(opts, lossless_batches=[])
        results: list[dict] = []
        done.append(results)
        for i, fs in enumerate(sets, 1):
            console.info(f"radiance bench: round {n}/{opts.rounds}, set {fs.name} ({i}/{len(sets)}): features "
                         f"{'+'.join(fs.features) or 'none'}, runner {fs.runner}; engine log {log_dir}")
            t = time.monotonic()
            r = run_set(fs, profile, platform, round_opts, log_dir, f"-r{n}" if opts.rounds > 1 else "")
            results.append(r)
            if "error" in r:
                console.warn(f"set {fs.name}: {r['error']} (log: {r['log']})")
            else:
                console.info(f"radiance bench: set {fs.name} done in {time.monotonic() - t:.0f} s")
            if on_set is not None:
                on_set(_report(profile, profile_path, platform, opts, commit, started, done))
    return _report(profile, profile_path, platform, opts, commit, started, done)


def _report(profile: Profile, profile_path: str, platform: str, opts: Options, commit: str, started,
            done: list[list[dict]]) -> dict:
    refs = [compare(results) for results in done]
    # a round still running is left out of the merge until it is complete
    complete = [r for r in done if len(r) == len(done[0])]
    results = done[0] if len(done) == 1 else rounds.merge_rounds(complete)
    device = next((r.get("device") for r in results if r.get("device")), None)
    report = {
        "kind": "radiance-bench", "date": started.isoformat(timespec="seconds"), "device": device,
        "commit": commit, "profile": profile_path, "profile_name": profile.name, "platform": platform,
        "model": profile.model.path, "drafter": profile.drafter.model_dump(mode="json"),
        "vllm_args": dict(profile.vllm_args),
        "vllm": next((r.get("vllm") for r in results if r.get("vllm")), None),
        "torch": next((r.get("torch") for r in results if r.get("torch")), None),
        "options": {"batches": opts.batches, "max_tokens": opts.max_tokens, "prompt_tokens": opts.prompt_tokens,
                    "repeat": opts.repeat, "lossless_batches": opts.lossless_batches, "eps": opts.eps,
                    "rounds": opts.rounds, "rounds_done": len(complete)},
        # dummy weights accept nothing: with synthetic rates every throughput here is at those rates
        # each row names its profile ("acceptance"); padding past a dynamic depth is never accepted there
        "acceptance": ({"kind": "synthetic", "rates": opts.acceptance[0], "profiles": opts.acceptance}
                       if opts.acceptance else {"kind": "model"}),
        # the set each vs_stock is a ratio to (rounds.reference)
        "reference": next((r for r in refs if r), None),
        "sets": list(results),
    }
    return report


def compare(results: list[dict]) -> str | None:
    """Adds each row's ratio to the reference set of the same round (rounds.reference) at the same batch and
    acceptance (``vs_stock``), in place; returns the reference's name."""
    base = rounds.reference(results)
    if base is None:
        return None
    ref = {rounds.row_key(r): r["decode_tok_s"] for r in base["results"]}
    for s in results:
        for r in s.get("results", []):
            stock = ref.get(rounds.row_key(r))
            if stock:
                r["vs_stock"] = round(r["decode_tok_s"] / stock, 3)
    return base["set"]


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=paths.REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
