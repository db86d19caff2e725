"""A stock engine for recording the target check's reference: the profile with its four features off.

Started the way `radiance up` starts the profile's engine (the same argument builder, runtime, private
socket and key), so the reference is measured on the same vLLM, model, dtype, quantisation, TP layout
and drafter as the deployment it will judge; only the patches are off. No gateway: nothing but the
recording talks to it, and it is stopped as soon as the reference is written.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

from .. import lifecycle
from ..engine_link import EngineLink


def stock_profile(profile):
    """The profile with every feature off (the drafter stays: stock speculative decoding)."""
    from ..profile import Features

    return profile.model_copy(update={"features": Features(), "name": f"{profile.name}-stock"})


@contextlib.asynccontextmanager
async def serve(profile, platform: str, log_path: Path) -> AsyncIterator[EngineLink]:
    """Start ``stock_profile(profile)``'s engine, yield its link once healthy, stop it afterwards."""
    stock = stock_profile(profile)
    docker = profile.runtime.kind == "docker"
    image = None
    if docker:
        from .. import images
        from ..runtime.docker import DockerEngine

        image = images.resolve(stock, platform)[2]
        engine = DockerEngine()
    else:
        from ..runtime.local import LocalEngine

        engine = LocalEngine()
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def announce(command: str) -> None:
        log_path.write_text(f"[radiance] stock engine for the target reference: {command}\n")

    async with lifecycle.serving(stock, platform=platform, engine=engine, deployment=stock.name,
                                 log_path=log_path, image=image, group_access=docker,
                                 what="the stock engine", announce=announce) as served:
        yield served.link
