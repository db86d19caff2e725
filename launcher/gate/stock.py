"""A stock engine for recording the target check's reference: the profile with its four features off.

Started the way `radiance up` starts the profile's engine (the same argument builder, runtime, private
socket and key), so the reference is measured on the same vLLM, model, dtype, quantisation, TP layout
and drafter as the deployment it will judge; only the patches are off. No gateway: nothing but the
recording talks to it, and it is stopped as soon as the reference is written.
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import AsyncIterator

from .. import engine_args, engine_link, errors
from ..engine_link import EngineLink
from ..runtime.base import EngineSpec


def stock_profile(profile):
    """The profile with every feature off (the drafter stays: stock speculative decoding)."""
    from ..profile import Features

    return profile.model_copy(update={"features": Features(), "name": f"{profile.name}-stock"})


@contextlib.asynccontextmanager
async def serve(profile, platform: str, log_path: Path) -> AsyncIterator[EngineLink]:
    """Start ``stock_profile(profile)``'s engine, yield its link once healthy, stop it afterwards."""
    stock = stock_profile(profile)
    runtime_kind = profile.runtime.kind
    socket_dir = engine_link.private_socket_dir(group_access=runtime_kind == "docker")
    link = EngineLink(f"{engine_link.UNIX}{socket_dir / engine_link.SOCKET_NAME}", engine_link.new_key())
    engine = handle = None
    try:
        cfg = await asyncio.to_thread(engine_args.from_profile, stock, platform=platform, uds=link.uds,
                                      engine_key=link.key)
        image = None
        if runtime_kind == "docker":
            from .. import images
            from ..runtime.docker import DockerEngine

            image = images.resolve(stock, platform)[2]
            engine = DockerEngine()
        else:
            from ..runtime.local import LocalEngine

            engine = LocalEngine()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"[radiance] stock engine for the target reference: {cfg.redacted_command()}\n")
        spec = EngineSpec.of(cfg, deployment=stock.name, platform=platform, log_path=log_path,
                             socket_dir=socket_dir, image=image)
        handle = await asyncio.to_thread(engine.start, spec)

        async def alive() -> bool:
            return await asyncio.to_thread(engine.alive, handle)

        try:
            await engine_link.wait_healthy(link, profile.runtime.startup_timeout_s, alive=alive)
        except engine_link.EngineExited:
            raise errors.LauncherError(f"the stock engine exited while loading; see {log_path}") from None
        except engine_link.EngineTimeout:
            raise errors.LauncherError(f"the stock engine was not healthy after "
                                       f"{profile.runtime.startup_timeout_s:.0f}s — fix: raise "
                                       f"runtime.startup_timeout_s or see {log_path}") from None
        yield link
    finally:
        if handle is not None:
            await asyncio.to_thread(engine.stop, handle, 30.0)
        engine_link.remove_socket_dir(socket_dir)
