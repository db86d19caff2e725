"""What this environment can run: device arch, vLLM version, and per feature whether its
hooks exist and its kernels build here.

    python -m radiance.capabilities --json [--arch gfx1201] [--aot]

The launcher runs this in the target environment (this Python, or inside the image) and
never imports it: the JSON on stdout is the contract.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from . import envs
from .features import BY_NAME, FEATURES
from .plugin import vllm_version
from .patching import version_in_range
from .versions import RADIANCE_VERSION, SUPPORTED_VLLM, VLLM_VERSION


def detect_device() -> dict:
    try:
        import torch
    except Exception as exc:
        return {"platform": "cpu", "arch": "cpu", "count": 0, "note": f"torch not importable: {exc}"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        if torch.version.hip:
            arch = props.gcnArchName.split(":")[0]
            platform = "rocm"
        else:
            arch = f"sm{props.major}{props.minor}"
            platform = "cuda"
        return {"platform": platform, "arch": arch, "count": torch.cuda.device_count(), "name": props.name}
    return {"platform": "cpu", "arch": "cpu", "count": 0}


def feature_report(feature: str, module: str, version: str | None, arch: str, aot_results: list[dict] | None) -> dict:
    out: dict = {"feature": feature, "knob": BY_NAME[feature].knob}
    try:
        mod = importlib.import_module(module)
        patches = list(mod.PATCHES)
    except ModuleNotFoundError as exc:
        reason = "not built in this version of radiance" if exc.name == module else f"import failed: {exc}"
        return {**out, "available": False, "reason": reason, "backend": None}
    except Exception as exc:
        return {**out, "available": False, "reason": f"import failed: {type(exc).__name__}: {exc}", "backend": None}
    for patch in patches:
        problem = patch.check_static(version)
        if problem:
            return {**out, "available": False, "reason": f"{patch.name}: {problem}", "backend": None}
    if arch == "cpu":
        return {**out, "available": True, "backend": "reference", "reason": "PyTorch reference kernels (CPU)"}
    if not BY_NAME[feature].kernels:
        return {**out, "available": True, "backend": None, "reason": "no kernels: host-side"}
    if aot_results is not None:
        tag = BY_NAME[feature].kernels
        mine = [r for r in aot_results if r.get("feature") == tag]
        bad = [r for r in mine if not r["ok"]]
        if bad:
            return {**out, "available": False, "backend": "triton",
                    "reason": f"kernel {bad[0]['name']} does not build for {arch}: {bad[0].get('error', '')}"}
        return {**out, "available": True, "backend": "triton", "reason": f"{len(mine)} kernels build for {arch}"}
    return {**out, "available": True, "backend": "triton", "reason": "Triton kernels (compiled on first use)"}


def report(arch: str | None = None, aot: bool = False) -> dict:
    device = detect_device()
    if arch:
        device = {**device, "arch": arch, "arch_overridden": True}
    version = vllm_version()
    aot_results = None
    if aot and device["arch"] != "cpu":
        from .kernels import aot as aot_mod

        aot_results = aot_mod.compile_all(device["arch"])
    features = {f.name: feature_report(f.name, f.module, version, device["arch"], aot_results) for f in FEATURES}
    return {
        "radiance_version": RADIANCE_VERSION,
        "vllm_version": version,
        "vllm_pinned": VLLM_VERSION,
        "vllm_supported": bool(version) and version_in_range(version, *SUPPORTED_VLLM),
        "device": device,
        "knob_problems": envs.validate_all(),
        "features": features,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m radiance.capabilities")
    p.add_argument("--json", action="store_true", help="print JSON (the launcher's contract)")
    p.add_argument("--arch", default=None, help="report for this arch instead of the detected one")
    p.add_argument("--aot", action="store_true", help="compile every kernel for the arch to prove it builds")
    args = p.parse_args(argv)
    data = report(args.arch, args.aot)
    if args.json:
        json.dump(data, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        d = data["device"]
        print(f"radiance {data['radiance_version']}  vLLM {data['vllm_version']}  device {d['platform']}/{d['arch']}")
        for f in data["features"].values():
            print(f"  {f['feature']:14s} {'yes' if f['available'] else 'no ':3s}  {f['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
