"""`radiance build PROFILE`: build (or --pull) the image the profile's platform needs."""
from __future__ import annotations

import click

from .. import errors, platforms
from ._common import PROFILE_ARG, load


@click.command("build")
@PROFILE_ARG
@click.option("--platform", type=click.Choice(platforms.WANTED), default=None,
              help="Image platform (default: the profile's runtime.platform, auto = probed).")
@click.option("--pull", is_flag=True, help="Pull the tagged image instead of building it.")
@click.option("--wheelhouse", type=click.Path(file_okay=False, exists=True), default=None,
              help="Build offline from the wheels in this directory.")
@click.option("--base-image", default=None, help="Override the Dockerfile's BASE_IMAGE.")
@click.option("--arch", default=None, help="GPU arch to compile kernels for (e.g. gfx1201, gfx942).")
def command(profile_path: str, platform: str | None, pull: bool, wheelhouse: str | None, base_image: str | None,
            arch: str | None) -> None:
    """Build or pull the engine image for PROFILE, with progress; prints the tag."""
    profile = load(profile_path)
    try:
        from .. import images
    except ImportError as exc:
        raise errors.LauncherError(f"image support is not available: {exc}") from None
    images.build_command(profile, platform=platform, pull=pull, wheelhouse=wheelhouse, base_image=base_image,
                         arch=arch)
