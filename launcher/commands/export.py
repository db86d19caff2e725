"""`radiance export k8s PROFILE -o DIR`: the profile as a Kustomize directory (deploy/k8s's shape)."""
from __future__ import annotations

from pathlib import Path

import click

from .. import console, platforms
from ._common import PROFILE_ARG, load


@click.group("export")
def command() -> None:
    """Render PROFILE for another runtime."""


@command.command("k8s")
@PROFILE_ARG
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write (base/ + kustomization.yaml + profile.yaml).")
@click.option("--platform", type=click.Choice(platforms.NAMES), default=None,
              help="Image and GPU resource to use (default: the profile's runtime.platform).")
@click.option("--arch", default=None, help="GPU arch of the image tag (default: the platform's, e.g. gfx1201).")
def k8s(profile_path: str, out_dir: str, platform: str | None, arch: str | None) -> None:
    """Write a Kustomize directory for PROFILE: the engine + gateway pod, Service, PDB, HF cache claim."""
    from ..k8s_export import export

    profile = load(profile_path)
    written = export(profile, profile_path, Path(out_dir), platform=platform, arch=arch)
    console.out.print(f"{profile.name}: wrote {len(written)} files to {out_dir} — render with "
                      f"`kubectl kustomize {out_dir}`, apply with `kubectl apply -k {out_dir}`")
