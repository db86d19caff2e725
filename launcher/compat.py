"""Can this machine run this profile? Hardware, engine, and kernels per enabled feature.

The capability table comes from ``python -m radiance.capabilities --json`` run in the target
environment (this Python for the local runtime); the launcher reads its JSON and never
imports the plugin.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import hardware
from .profile import Profile


@dataclass
class Finding:
    check: str
    status: str          # ok | warn | fail
    detail: str


@dataclass
class CompatReport:
    profile: str
    profile_hash: str
    platform: str
    runtime: str
    findings: list[Finding] = field(default_factory=list)
    hardware: dict = field(default_factory=dict)
    capabilities: dict | None = None

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
    env = dict(os.environ, RADIANCE_REPORT_DIR="")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"capability report failed: {tail[0]}")
    return json.loads(proc.stdout)


def resolve_platform(profile: Profile, hw: "hardware.HardwareReport") -> str:
    wanted = profile.runtime.platform
    return hw.platform if wanted == "auto" else wanted


def assess(profile: Profile, *, runtime: str | None = None, capabilities: bool = True,
           root: Path = Path("/")) -> CompatReport:
    runtime = runtime or profile.runtime.kind
    hw = hardware.probe_all(root=root)
    platform = resolve_platform(profile, hw)
    rep = CompatReport(profile=profile.name, profile_hash=profile.fingerprint(), platform=platform,
                       runtime=runtime, hardware=hw.to_dict())

    gpus = ", ".join(f"{g.name} ({g.arch})" for g in hw.gpus) or "none"
    rep.add("hardware", "ok", f"platform {hw.platform}; GPUs: {gpus}")
    res = hardware.evaluate(hw, tp=profile.parallel.tp, pp=profile.parallel.pp, min_memory_gib=None,
                            platform_wanted=profile.runtime.platform, environ=dict(os.environ))
    for w in res.warnings:
        rep.add("hardware", "warn", w)
    for p in res.problems:
        rep.add("hardware", "fail", p)
    if platform == "cpu" and profile.model.quantization == "fp8":
        rep.add("engine", "warn", "fp8 quantization on CPU runs through reference kernels (slow)")

    if runtime == "local":
        try:
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                rep.add("engine", "fail", "vLLM is not installed in this Python — fix: `make install` "
                        "(CPU) or use runtime docker")
                return rep
        except ValueError:
            pass
    if not capabilities:
        return rep
    if runtime != "local":
        rep.add("kernels", "warn", f"capabilities are read inside the image for runtime {runtime}; "
                "run `radiance build` first")
        return rep
    try:
        caps = capabilities_local()
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        rep.add("kernels", "fail", str(exc))
        return rep
    rep.capabilities = caps
    if not caps.get("vllm_supported"):
        rep.add("engine", "fail", f"vLLM {caps.get('vllm_version')} is not the pinned {caps.get('vllm_pinned')}")
    else:
        rep.add("engine", "ok", f"vLLM {caps['vllm_version']}, radiance {caps['radiance_version']}")
    for problem in caps.get("knob_problems", []):
        rep.add("knobs", "fail", problem)
    dev_arch = caps.get("device", {}).get("arch")
    for name in profile.features.enabled_names():
        feat = caps.get("features", {}).get(name)
        if feat is None:
            rep.add(f"feature {name}", "fail", "unknown to this radiance build")
        elif feat["available"]:
            rep.add(f"feature {name}", "ok", f"{feat['backend']} on {dev_arch}: {feat['reason']}")
        else:
            # A declined feature does not stop the server (it runs stock) but the user asked for it.
            rep.add(f"feature {name}", "warn", f"will be declined on {dev_arch}: {feat['reason']}")
    return rep
