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
from . import plan, rounds, worker_extension
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
    set_env: dict[str, dict[str, str]] = field(default_factory=dict)   # by set name, over engine_env
    timeout_s: float = 1800.0
    # vLLM's synthetic rejection sampler (rounds.py): each profile's rates in turn, in one engine per set
    acceptance: list[list[float]] | None = None
    rounds: int = 1                        # every set once per round, rounds one after another
    # the first set (stock) loaded once and kept: each other set loaded once and measured against it,
    # reference and set alternating ``rounds`` times (two engines share the device: half its memory each)
    keep_reference: bool = False
    # with keep_reference: every set's engine kept, all asleep (vLLM's sleep mode, level 2; dummy weights,
    # drawn again on waking) but the one measured, so each has the profile's whole memory budget while it runs
    # (a 27B-shaped engine needs ~0.45 GiB of KV and GDN state per request: half an H200 holds ~22 at once,
    # not B = 32); rounds of stock and every set (bench_taking_turns)
    take_turns: bool = False


def runner_env(fs: plan.FeatureSet, platform: str) -> dict[str, str]:
    """The set's model runner, named to vLLM on a GPU (a CPU has one)."""
    return {} if platform == "cpu" else {"VLLM_USE_V2_MODEL_RUNNER": "1" if fs.runner == "v2" else "0"}


def engine_env(fs: plan.FeatureSet, cfg_env: dict[str, str], platform: str) -> dict[str, str]:
    env = dict(cfg_env)
    if not fs.plugin:
        env["RADIANCE_ENABLE"] = "0"
    env.update(runner_env(fs, platform))
    return env


@dataclass
class _Engine:
    """What one set's worker is started with, and what its result is annotated with."""
    fs: plan.FeatureSet
    depth: int
    env: dict[str, str]
    job: dict
    log_path: Path
    command: str


def _engine(fs: plan.FeatureSet, profile: Profile, platform: str, opts: Options, log_dir: Path,
            log_suffix: str = "", seed_offset: int = 0) -> _Engine:
    p = plan.for_set(profile, fs)
    cfg = engine_args.from_profile(p, platform=platform, environ={**os.environ, **runner_env(fs, platform)})
    server_args = cfg.server_args
    if seed_offset:  # from the profile's seed, or vLLM's default 0
        server_args = [*server_args, "--seed", str((_seed_of(server_args) or 0) + seed_offset)]
    if opts.take_turns:
        server_args = [*server_args, "--enable-sleep-mode"]
    if opts.acceptance:
        server_args = rounds.with_synthetic_acceptance(server_args, opts.acceptance[0])
    if opts.take_turns or (opts.acceptance and len(opts.acceptance) > 1):
        server_args = worker_extension.with_extension(server_args)
    env = dict(os.environ)
    env.update(engine_env(fs, cfg.env, platform))
    env.update(opts.engine_env)
    env.update(opts.set_env.get(fs.name, {}))
    env.update(cfg.secret_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    job = {"set": fs.name, "server_args": server_args, "batches": opts.batches, "max_tokens": opts.max_tokens,
           "prompt_tokens": opts.prompt_tokens, "repeat": opts.repeat, "eps": opts.eps,
           "lossless_batches": opts.lossless_batches, "prompts": prompt_texts(max(opts.batches)),
           "acceptance": opts.acceptance}
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{fs.name.replace('@', '-').replace('+', '_').replace('/', '-')}{log_suffix}.log"
    return _Engine(fs, p.drafter.num_speculative_tokens, env, job, log_path, cfg.redacted_command())


def _spawn(e: _Engine, job_path: Path, out_path: Path, log, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    job_path.write_text(json.dumps(e.job))
    procs.become_subreaper()
    log.write(f"[radiance] bench set {e.fs.name}: {e.command}\n".encode())
    log.flush()
    return subprocess.Popen([sys.executable, "-m", "launcher.bench.worker", str(job_path), str(out_path)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=stdin, env=e.env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    # The worker's engine core and workers go with it, whatever state it left them in, also when this
    # process is interrupted.
    LocalEngine().stop(EngineHandle(runtime="local", ident=str(proc.pid), spec=None), timeout=20.0)


def _seed_of(server_args: list[str]) -> int | None:
    seeds = [server_args[i + 1] for i, a in enumerate(server_args[:-1]) if a == "--seed"]
    return int(seeds[-1]) if seeds else None


def _annotate(result: dict, e: _Engine) -> dict:
    fs = e.fs
    result.update(features=list(fs.features), plugin=fs.plugin, runner=fs.runner, depth=e.depth,
                  seed=_seed_of(e.job["server_args"]),
                  depth_override=fs.depth is not None, log=str(e.log_path),
                  knobs={k: v for k, v in sorted(e.env.items())
                         if k.startswith("RADIANCE_") or k == "VLLM_USE_V2_MODEL_RUNNER"})
    if "error" in result:
        result["log_tail"] = e.log_path.read_text(errors="replace").splitlines()[-15:]
    rounds.add_expected(result)
    return result


def run_set(fs: plan.FeatureSet, profile: Profile, platform: str, opts: Options, log_dir: Path,
            log_suffix: str = "", seed_offset: int = 0) -> dict:
    e = _engine(fs, profile, platform, opts, log_dir, log_suffix, seed_offset)
    with tempfile.TemporaryDirectory(prefix="radiance-bench-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        t0 = time.monotonic()
        with open(e.log_path, "wb") as log:
            proc = _spawn(e, job_path, out_path, log)
            try:
                proc.wait(timeout=opts.timeout_s)
            except subprocess.TimeoutExpired:
                pass
            finally:
                _stop(proc)
        result = json.loads(out_path.read_text()) if out_path.exists() else {
            "set": fs.name, "error": f"no result after {time.monotonic() - t0:.0f} s (timeout {opts.timeout_s:.0f} s)"}
    return _annotate(result, e)


# how long a sleep or a wake may take before the engine counts as gone (level 2 takes seconds; the level-1
# sleep of a 27B engine, 51 GiB to host memory, took 40 s)
TURN_TIMEOUT_S = 300.0
# what vLLM names the processes that hold an engine (its engine core, its workers): one that dies while its
# worker waits on it leaves that worker waiting for good (the nineteenth session's engine core, killed by the
# host's OOM killer mid-sleep, held its bench for 11 minutes)
ENGINE_PROCESS_PREFIX = "VLLM::"


class Resident:
    """One set's engine kept loaded between measurements (``--keep-reference``): started once, then measured
    on request, so that another engine can be timed between two of its measurements."""

    def __init__(self, fs: plan.FeatureSet, profile: Profile, platform: str, opts: Options, log_dir: Path):
        self.e = _engine(fs, profile, platform, opts, log_dir)
        self.e.job["serve"] = True
        self.opts = opts
        self._tmp = tempfile.TemporaryDirectory(prefix="radiance-bench-")
        tmp = Path(self._tmp.name)
        self.out = tmp / "result.json"
        self._log = open(self.e.log_path, "wb")
        self.proc = _spawn(self.e, tmp / "job.json", self.out, self._log, stdin=subprocess.PIPE)
        self.n = 0
        self.error: str | None = None
        self._engine_procs: dict[int, int] | None = None   # {pid: start time}, once the engine is up

    def _engine_gone(self) -> str | None:
        """The engine process that died since the engine came up, if one did."""
        for pid, started in (self._engine_procs or {}).items():
            if not procs.alive(pid, started):
                return f"the engine process {pid} ({ENGINE_PROCESS_PREFIX}...) exited"
        return None

    def _await(self, path: Path, what: str, timeout_s: float | None = None) -> bool:
        """Blocks until the worker writes ``path``; False (and ``error`` set) when it or its engine died, or
        it timed out."""
        t0 = time.monotonic()
        limit = self.opts.timeout_s if timeout_s is None else timeout_s
        while not path.exists():
            gone = self._engine_gone()
            if self.proc.poll() is not None or gone or time.monotonic() - t0 > limit:
                # a worker that failed to start says why in RESULT
                self.error = (json.loads(self.out.read_text())["error"] if self.out.exists() else
                              f"{gone} while the bench waited for {what} (killed for memory? the host's kernel "
                              f"log says)" if gone else
                              f"engine gone or no {what} after {time.monotonic() - t0:.0f} s")
                return False
            time.sleep(0.2)
        return True

    def wait_ready(self) -> bool:
        """Blocks until the engine is up; False (and ``error`` set) when it failed or timed out."""
        if self.error is not None or not self._await(self.out.parent / "ready", "start"):
            return False
        if self._engine_procs is None:
            self._engine_procs = procs.named_members(self.proc.pid, ENGINE_PROCESS_PREFIX)
        return True

    def _ask(self, cmd: dict, what: str, timeout_s: float | None = None) -> dict | None:
        """One command to the worker and its answer (None, with ``error`` set, when none came)."""
        if not self.wait_ready():
            return None
        self.n += 1
        path = self.out.parent / f"{self.out.name}.{self.n}"
        try:
            self.proc.stdin.write((json.dumps({**cmd, "n": self.n}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # a worker gone: _await says so
        if not self._await(path, f"{what} ({self.n})", timeout_s):
            return None
        return json.loads(path.read_text())

    def measure(self, lossless: bool) -> dict:
        """One measurement (every acceptance profile, every batch), its result annotated like run_set's."""
        result = self._ask({"lossless": lossless}, "result of a measurement")
        return _annotate(result if result is not None else {"set": self.e.fs.name, "error": self.error}, self.e)

    def turn(self, op: str) -> float | None:
        """``sleep`` (vLLM's level 2: weights and KV cache dropped) or ``wake`` (weights drawn again, worker.turn);
        the seconds it took, or None (``error`` set) where it failed."""
        answer = self._ask({"op": op}, op, min(self.opts.timeout_s, TURN_TIMEOUT_S))
        if answer is not None and "error" in answer:
            self.error = f"{op}: {answer['error']}"
            return None
        return None if answer is None else float(answer.get("s", 0.0))

    def close(self) -> None:
        if self._log.closed:   # closed already (a set dropped with its error)
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        _stop(self.proc)
        self._log.close()
        self._tmp.cleanup()


def bench(profile: Profile, profile_path: str, platform: str, sets: list[plan.FeatureSet], opts: Options,
          commit: str, log_dir: Path, on_set=None) -> dict:
    if opts.keep_reference and opts.take_turns:
        return bench_taking_turns(profile, profile_path, platform, sets, opts, commit, log_dir, on_set)
    if opts.keep_reference:
        return bench_beside_reference(profile, profile_path, platform, sets, opts, commit, log_dir, on_set)
    return bench_fresh(profile, profile_path, platform, sets, opts, commit, log_dir, on_set)


def bench_beside_reference(profile: Profile, profile_path: str, platform: str, sets: list[plan.FeatureSet],
                           opts: Options, commit: str, log_dir: Path, on_set=None) -> dict:
    """``sets[0]`` (stock) started once and kept loaded; each other set started in turn beside it and
    measured ``opts.rounds`` times, alternating with the reference (stock, set, stock, set, ...), each ratio
    taken within its pair. Engine starts: one per set instead of one per set per round; the outputs are
    re-scored in each engine's first measurement only."""
    started = dt.datetime.now(dt.timezone.utc)
    pairs: dict[str, list[list[dict]]] = {fs.name: [] for fs in sets[1:]}
    report = lambda: _report_pairs(profile, profile_path, platform, opts, commit, started, sets, pairs)
    console.info(f"radiance bench: reference {sets[0].name} started once and kept; engine log {log_dir}")
    ref = Resident(sets[0], profile, platform, opts, log_dir)
    first_ref = True
    try:
        for i, fs in enumerate(sets[1:], 1):
            console.info(f"radiance bench: set {fs.name} ({i}/{len(sets) - 1}) beside {sets[0].name}: features "
                         f"{'+'.join(fs.features) or 'none'}, runner {fs.runner}, {opts.rounds} pair(s)")
            eng = Resident(fs, profile, platform, opts, log_dir)
            try:
                for n in range(opts.rounds):
                    # the reference is not measured while the set's engine loads: both are up first
                    eng.wait_ready()
                    a = ref.measure(lossless=first_ref)
                    b = eng.measure(lossless=n == 0)
                    first_ref = False
                    _record(pairs, fs.name, a, b)
                    if on_set is not None:
                        on_set(report())
                    if "error" in b:
                        break
            finally:
                eng.close()
    finally:
        ref.close()
    return report()


def _record(pairs: dict[str, list[list[dict]]], name: str, a: dict, b: dict) -> None:
    compare([a, b])
    pairs[name].append([a, b])
    for r in (a, b):
        if "error" in r:
            console.warn(f"set {r['set']}: {r['error']} (log: {r['log']})")


def bench_taking_turns(profile: Profile, profile_path: str, platform: str, sets: list[plan.FeatureSet],
                       opts: Options, commit: str, log_dir: Path, on_set=None) -> dict:
    """``--keep-reference --take-turns``: every set's engine started once and kept, all asleep but the one
    measured (vLLM's sleep mode, level 2: nothing parked in host memory), so each runs with the profile's own
    memory budget. Then ``opts.rounds`` rounds of stock and every set, the sets in reverse order every other
    round (no set always furthest from its stock); each set's ratio is to its round's stock measurement.
    A set that fails to start, sleep or be measured is dropped with its error; the others go on."""
    started = dt.datetime.now(dt.timezone.utc)
    pairs: dict[str, list[list[dict]]] = {fs.name: [] for fs in sets[1:]}
    failed: dict[str, dict] = {}
    report = lambda: _report_pairs(profile, profile_path, platform, opts, commit, started, sets, pairs, failed)
    console.info(f"radiance bench: {len(sets)} engines started once and kept, one awake at a time; engine log "
                 f"{log_dir}")
    live: list[Resident] = []
    ref = Resident(sets[0], profile, platform, opts, log_dir)
    try:
        if ref.turn("sleep") is None:   # the next engine starts with the device to itself
            return _failed_reference(ref, failed, sets, report)
        for i, fs in enumerate(sets[1:], 1):
            console.info(f"radiance bench: set {fs.name} ({i}/{len(sets) - 1}) started and put to sleep: features "
                         f"{'+'.join(fs.features) or 'none'}, runner {fs.runner}")
            eng = Resident(fs, profile, platform, opts, log_dir)
            if eng.turn("sleep") is None:
                _drop(eng, failed, eng.error)
            else:
                live.append(eng)
        for n in range(opts.rounds):
            a = _awake_for(ref, lossless=n == 0)
            if ref.error is not None:   # no stock this round, or one that holds the device: nothing to go on with
                for eng in live:
                    _record(pairs, eng.e.fs.name, a, _annotate(
                        {"set": eng.e.fs.name, "error": f"not measured: {ref.e.fs.name}: {ref.error}"}, eng.e))
                break
            for eng in list(live if n % 2 == 0 else live[::-1]):
                b = _awake_for(eng, lossless=n == 0)
                _record(pairs, eng.e.fs.name, a, b)
                if eng.error is not None:   # gone, or awake for good: it cannot give the device back
                    live.remove(eng)
                    eng.close()
                if on_set is not None:   # after every pair: a run cut short keeps each one measured
                    on_set(report())
    finally:
        for eng in live:
            eng.close()
        ref.close()
    return report()


def _awake_for(eng: Resident, lossless: bool) -> dict:
    """``eng`` woken, measured and put back to sleep; its measurement, or the error that prevented it. A sleep
    that fails after a measurement keeps the measurement and leaves ``eng.error`` set."""
    if eng.turn("wake") is None:
        return _annotate({"set": eng.e.fs.name, "error": eng.error}, eng.e)
    result = eng.measure(lossless=lossless)
    if "error" in result:
        eng.error = eng.error or result["error"]
    elif eng.turn("sleep") is None:
        console.warn(f"set {eng.e.fs.name}: {eng.error}: measured, then stopped (it cannot give the device back)")
    return result


def _drop(eng: Resident, failed: dict[str, dict], why: str | None) -> None:
    failed[eng.e.fs.name] = _annotate({"set": eng.e.fs.name, "error": why or "no answer"}, eng.e)
    console.warn(f"set {eng.e.fs.name}: {why} (log: {eng.e.log_path})")
    eng.close()


def _failed_reference(ref: Resident, failed: dict[str, dict], sets: list[plan.FeatureSet], report) -> dict:
    """The reference could not be put to sleep (vLLM's sleep mode missing or refused): every set is reported
    with that error, none is started."""
    _drop(ref, failed, ref.error)
    for fs in sets[1:]:
        failed[fs.name] = {"set": fs.name, "error": "not started: the reference could not sleep"}
    return report()


def _report_pairs(profile: Profile, profile_path: str, platform: str, opts: Options, commit: str, started,
                  sets: list[plan.FeatureSet], pairs: dict[str, list[list[dict]]],
                  failed: dict[str, dict] | None = None) -> dict:
    """One entry per set like bench_fresh's (merge_pairs), in the order of ``sets``; a set in ``failed``
    (never measured) as its error."""
    merged = {m["set"]: m for m in merge_pairs(pairs)}
    merged.update(failed or {})
    entries = [merged[fs.name] for fs in sets if fs.name in merged]
    done = min((len(ps) for ps in pairs.values() if ps), default=0)
    report = _header(profile, profile_path, platform, opts, commit, started, entries, done)
    report["reference"] = sets[0].name
    report["sets"] = entries
    return report


def merge_pairs(pairs: dict[str, list[list[dict]]]) -> list[dict]:
    """``--keep-reference``'s measurements, ``{set: [[reference, set], ...]}`` in the order they ran -> the
    reference from all its measurements, then each set from its own pairs (median, spread, every pair kept
    under ``rounds``), each ratio taken within its pair."""
    for ps in pairs.values():
        for p in ps:
            compare(p)
    # under --take-turns one stock measurement is every set's reference in its round: counted once
    refs = list({id(p[0]): p[0] for ps in pairs.values() for p in ps}.values())
    merged = [rounds.merge_rounds([[r] for r in refs])[0]] if refs else []
    return merged + [rounds.merge_rounds(ps)[1] for ps in pairs.values() if ps]


def split_pairs(sets: list[dict], shared_reference: bool = False) -> dict[str, list[list[dict]]]:
    """A ``--keep-reference`` report's sets back into merge_pairs' pairs: the reference's measurements are
    kept in the order they ran, each set's pairs in turn, so the i-th of a set pairs with the reference
    measurement taken just before it (not with the i-th of the reference's, which belongs to the first set).
    ``shared_reference`` (a ``--take-turns`` report, options.take_turns): the i-th of every set pairs with
    the i-th of the reference, its round's. A set with an error and no rounds was never measured: left out."""
    ref, rest = sets[0], sets[1:]
    refs = list(ref.get("rounds") or [ref])
    pairs: dict[str, list[list[dict]]] = {}
    i = 0
    for s in rest:
        if shared_reference and "error" in s and not s.get("rounds") and not s.get("results"):
            continue
        mine = list(s.get("rounds") or [s])
        at = 0 if shared_reference else i
        pairs[s["set"]] = [[refs[at + j], m] for j, m in enumerate(mine) if at + j < len(refs)]
        i += len(mine)
    return pairs


def bench_fresh(profile: Profile, profile_path: str, platform: str, sets: list[plan.FeatureSet], opts: Options,
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
            # vLLM's synthetic sampler draws from the global generator, seeded at start (default 0): a fresh
            # engine would repeat the previous round's draws, and the rounds would sample none of their luck
            # (H100, 2026-12-06: stock@v2's B = 1 acceptance length was 4.333 in all three rounds)
            r = run_set(fs, profile, platform, round_opts, log_dir, f"-r{n}" if opts.rounds > 1 else "",
                        seed_offset=n - 1 if opts.acceptance else 0)
            results.append(r)
            if "error" in r:
                console.warn(f"set {fs.name}: {r['error']} (log: {r['log']})")
            else:
                console.info(f"radiance bench: set {fs.name} done in {time.monotonic() - t:.0f} s")
            if on_set is not None:
                on_set(_report(profile, profile_path, platform, opts, commit, started, done))
    return _report(profile, profile_path, platform, opts, commit, started, done)


def merge_done(done: list[list[dict]]) -> tuple[list[dict], str | None, int]:
    """Rounds of set results (each in the sets' order) -> (one entry per set, the reference's name, complete
    rounds): ratios taken within each round, then each set's median and spread over the rounds it ran in.
    A round cut short (the device's time spent mid-round) still counts for the sets it reached: each of
    their ratios is to the reference of that same round, which runs first."""
    refs = [compare(results) for results in done]
    complete = sum(len(r) == len(done[0]) for r in done)
    results = done[0] if len(done) == 1 else rounds.merge_rounds(done)
    return results, next((r for r in refs if r), None), complete


def _report(profile: Profile, profile_path: str, platform: str, opts: Options, commit: str, started,
            done: list[list[dict]]) -> dict:
    results, reference, complete = merge_done(done)
    report = _header(profile, profile_path, platform, opts, commit, started, results, complete)
    # the set each vs_stock is a ratio to (rounds.reference)
    report["reference"] = reference
    report["sets"] = list(results)
    return report


def _header(profile: Profile, profile_path: str, platform: str, opts: Options, commit: str, started,
            results: list[dict], rounds_done: int) -> dict:
    return {
        "kind": "radiance-bench", "date": started.isoformat(timespec="seconds"),
        "device": next((r.get("device") for r in results if r.get("device")), None),
        "commit": commit, "profile": profile_path, "profile_name": profile.name, "platform": platform,
        "model": profile.model.path, "drafter": profile.drafter.model_dump(mode="json"),
        "vllm_args": dict(profile.vllm_args),
        "vllm": next((r.get("vllm") for r in results if r.get("vllm")), None),
        "torch": next((r.get("torch") for r in results if r.get("torch")), None),
        "options": {"batches": opts.batches, "max_tokens": opts.max_tokens, "prompt_tokens": opts.prompt_tokens,
                    "repeat": opts.repeat, "lossless_batches": opts.lossless_batches, "eps": opts.eps,
                    "rounds": opts.rounds, "rounds_done": rounds_done, "keep_reference": opts.keep_reference,
                    "take_turns": opts.take_turns},
        # dummy weights accept nothing: with synthetic rates every throughput here is at those rates
        # each row names its profile ("acceptance"); padding past a dynamic depth is never accepted there
        "acceptance": ({"kind": "synthetic", "rates": opts.acceptance[0], "profiles": opts.acceptance}
                       if opts.acceptance else {"kind": "model"}),
    }


def compare(results: list[dict]) -> str | None:
    """Adds each row's ratio to the reference set of the same round (rounds.reference) at the same batch and
    acceptance (``vs_stock``; ``vs_stock_expected`` at the acceptance profile's expectation, rounds.add_expected),
    in place; returns the reference's name."""
    base = rounds.reference(results)
    if base is None:
        return None
    for key, ratio in (("decode_tok_s", "vs_stock"), ("decode_tok_s_expected", "vs_stock_expected")):
        ref = {rounds.row_key(r): r[key] for r in base["results"] if r.get(key)}
        for s in results:
            for r in s.get("results", []):
                stock = ref.get(rounds.row_key(r))
                if stock and r.get(key):
                    r[ratio] = round(r[key] / stock, 3)
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
