"""A profile rendered into the Kubernetes shape of ``deploy/k8s``: a copy of the base and an overlay
that sets what the profile decides (image tag, GPU request from its TP, the startup probe's budget from
runtime.startup_timeout_s, the drain, the API key's Secret). ``kubectl kustomize DIR`` renders it.

The in-tree overlays (deploy/k8s/overlays/<platform>) are this function's output for the shipped
profiles; a test keeps them so.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import yaml

from radiance import envs

from . import errors, images, paths, platforms
from .profile import Profile, load_profile

BASE = paths.REPO_ROOT / "deploy" / "k8s" / "base"
GPU_RESOURCE = {p.name: p.k8s_gpu_resource for p in platforms.PLATFORMS.values() if p.k8s_gpu_resource}
GATEWAY_PORT = 8000
PRESTOP_S = 5           # the gateway's preStop: endpoints drop the pod before the drain refuses work
ENGINE_STOP_S = 20      # vLLM's own exit after SIGTERM, once nothing is in flight
STARTUP_PERIOD_S = 10
SECRET = "radiance-secrets"


def overlay_files(profile: Profile, profile_text: str, platform: str, base_ref: str,
                  arch: str | None = None, drain_s: float | None = None) -> dict[str, str]:
    """{file name: text} of the overlay for ``profile`` on ``platform`` over the base at ``base_ref``."""
    if platform not in platforms.NAMES:
        raise errors.UsageError(f"platform {platform!r}: Kubernetes needs one of {', '.join(platforms.NAMES)} — "
                                "fix: pass --platform or set runtime.platform in the profile")
    amd_devices = platforms.get(platform).probe == "amd"
    drain = float(envs.get("RADIANCE_DRAIN_TIMEOUT") if drain_s is None else drain_s)
    repo, _, tag = images.image_tag(platform, arch).rpartition(":")
    engine: dict = {
        "name": "engine",
        "env": [{"name": "RADIANCE_PLATFORM", "value": platform}],
        "startupProbe": {"failureThreshold": math.ceil(profile.runtime.startup_timeout_s / STARTUP_PERIOD_S)},
        "lifecycle": {"preStop": {"exec": {"command": [
            "radiance-engine", "--await-closed", str(GATEWAY_PORT), "--timeout", f"{PRESTOP_S + drain + 5:g}"]}}},
    }
    if platform in GPU_RESOURCE:
        n = str(profile.parallel.tp * profile.parallel.pp)
        engine["resources"] = {"requests": {GPU_RESOURCE[platform]: n}, "limits": {GPU_RESOURCE[platform]: n}}
    if amd_devices:  # as compose's ROCm service: the video/render groups own /dev/kfd and /dev/dri
        engine["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    gateway_env = [{"name": "RADIANCE_DRAIN_TIMEOUT", "value": f"{drain:g}"}]
    if profile.server.api_key_env:
        gateway_env.append({"name": profile.server.api_key_env, "valueFrom": {"secretKeyRef": {
            "name": SECRET, "key": "api-key", "optional": False}}})
    pod: dict = {"terminationGracePeriodSeconds": int(PRESTOP_S + drain + ENGINE_STOP_S),
                 "containers": [engine, {"name": "gateway", "env": gateway_env}]}
    if amd_devices:
        pod["securityContext"] = {"supplementalGroups": [44, 110]}  # video, render (Debian/Ubuntu ids)
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "radiance"},
             "spec": {"template": {"spec": pod}}}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base_ref],
        "labels": [{"pairs": {"radiance.profile": profile.name}}],
        "images": [{"name": "radiance", "newName": repo, "newTag": tag}],
        "configMapGenerator": [{"name": "radiance-profile", "behavior": "replace", "files": ["profile.yaml"]}],
        "patches": [{"path": "deployment-patch.yaml"}],
    }
    head = (f"# Rendered by `radiance export k8s` from profile {profile.name} for {platform} "
            f"(image {repo}:{tag}). Regenerate rather than edit.\n")
    return {"kustomization.yaml": head + yaml.safe_dump(kustomization, sort_keys=False),
            "deployment-patch.yaml": head + yaml.safe_dump(patch, sort_keys=False),
            "profile.yaml": profile_text}


def export(profile: Profile, profile_path: str, out_dir: Path, platform: str | None = None,
           arch: str | None = None) -> list[Path]:
    """Write ``out_dir``: ``base/`` (a copy of deploy/k8s/base) and the overlay over it. Returns the
    files written. Refuses a non-empty ``out_dir`` that is not a previous export."""
    platform = platform or profile.runtime.platform
    if platform == platforms.AUTO:
        raise errors.UsageError(f"{profile_path}: runtime.platform is auto — fix: pass --platform "
                                f"{'|'.join(platforms.NAMES)}")
    out_dir = Path(out_dir)
    marker = out_dir / "kustomization.yaml"
    if out_dir.exists() and any(out_dir.iterdir()) and not (
            marker.exists() and "radiance export k8s" in marker.read_text().splitlines()[0]):
        raise errors.UsageError(f"{out_dir}: not empty and not a previous export — fix: choose an empty directory")
    files = overlay_files(profile, Path(profile_path).read_text(), platform, "base", arch)
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out_dir / "base", ignore_errors=True)
    shutil.copytree(BASE, out_dir / "base")
    written = [out_dir / "base" / p.name for p in sorted((out_dir / "base").iterdir())]
    for name, text in files.items():
        (out_dir / name).write_text(text)
        written.append(out_dir / name)
    return written


# deploy/k8s/overlays/<name>: (profile, platform). `python -m launcher.k8s_export` rewrites them.
# One per platform, named after it: a GPU platform shows the TP=2 profile, the CPU the tiny one.
TREE_OVERLAYS = {p.name: ("profiles/qwen3next-tp2.yaml" if p.gpu else "profiles/tiny-cpu.yaml", p.name)
                 for p in platforms.PLATFORMS.values()}
BASE_PROFILE = "profiles/tiny-cpu.yaml"


def tree_overlay_files(name: str) -> dict[str, str]:
    rel, platform = TREE_OVERLAYS[name]
    path = paths.REPO_ROOT / rel
    # the drain is the knob's default, not whatever this shell has set
    return overlay_files(load_profile(path), path.read_text(), platform, "../../base",
                         drain_s=float(envs.get("RADIANCE_DRAIN_TIMEOUT", {})))


def main() -> int:
    root = paths.REPO_ROOT / "deploy" / "k8s"
    shutil.copyfile(paths.REPO_ROOT / BASE_PROFILE, root / "base" / "profile.yaml")
    for name in TREE_OVERLAYS:
        d = root / "overlays" / name
        d.mkdir(parents=True, exist_ok=True)
        for fname, text in tree_overlay_files(name).items():
            (d / fname).write_text(text)
    print(f"wrote deploy/k8s/overlays/{{{','.join(TREE_OVERLAYS)}}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
