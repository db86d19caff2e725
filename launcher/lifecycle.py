"""One engine's life, written once: a profile → a started engine (``start``) → ready (its /health
answers: ``engine_link.wait_ready``, which the external runtime's engine also goes through) → (optionally)
gated (``gate``) → stopped; ``serving`` is the four in one ``async with``.

Every vLLM server radiance starts goes through here: `radiance up`'s (the local and docker runtimes, in
steps, since the supervisor puts its gateway and phases between them), the stock engine that records the
target check's reference (``serving``), and each Ray Serve replica (in its constructor). Each gets its
command and environment from ``engine_args.from_profile`` and its only door from ``open_door``: a private
socket and a key of its own (launcher.engine_link).
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable

from . import engine_args, engine_link
from .engine_link import EngineLink
from .runtime.base import EngineHandle, EngineSpec

if TYPE_CHECKING:
    from .engine_args import EngineConfig
    from .gate.verdict import GateOutcome
    from .profile import Profile
    from .runtime.base import Engine


@dataclass
class Door:
    """The engine's only way in: a socket in a fresh directory only we (and, with group access, our group:
    a container's user) can enter, and a key of this engine's."""
    socket_dir: Path
    link: EngineLink

    def close(self) -> None:
        engine_link.remove_socket_dir(self.socket_dir)


def open_door(group_access: bool = False) -> Door:
    socket_dir = engine_link.private_socket_dir(group_access=group_access)
    return Door(socket_dir, EngineLink(f"{engine_link.UNIX}{socket_dir / engine_link.SOCKET_NAME}",
                                       engine_link.new_key()))


@dataclass
class StartedEngine:
    """A vLLM server that ``start`` started behind a door."""
    engine: "Engine"
    handle: EngineHandle
    config: "EngineConfig"
    link: EngineLink

    async def alive(self) -> bool:
        # The docker engine asks the daemon: never on the event loop a gateway serves from.
        return await asyncio.to_thread(self.engine.alive, self.handle)

    def stop_blocking(self, timeout: float) -> None:
        """For callers with no event loop to hand (a Ray replica's destructor)."""
        self.engine.stop(self.handle, timeout)

    async def stop(self, timeout: float) -> None:
        await asyncio.to_thread(self.engine.stop, self.handle, timeout)


async def start(profile: "Profile", *, platform: str, engine: "Engine", door: Door, deployment: str,
                log_path: Path | None, image: str | None = None,
                announce: Callable[[str], None] = lambda command: None,
                prepare: Callable[["EngineConfig"], None] = lambda config: None) -> StartedEngine:
    """Start ``profile``'s engine behind ``door`` and return at once. ``announce(command)`` gets the command
    line (key redacted) before it starts; ``prepare(config)`` may adjust its environment first."""
    cfg = await asyncio.to_thread(engine_args.from_profile, profile, platform=platform, uds=door.link.uds,
                                  engine_key=door.link.key)
    prepare(cfg)
    spec = EngineSpec.of(cfg, deployment=deployment, platform=platform, log_path=log_path,
                         socket_dir=door.socket_dir, image=image)
    announce(cfg.redacted_command())
    handle = await asyncio.to_thread(engine.start, spec)
    return StartedEngine(engine, handle, cfg, door.link)


async def gate(profile: "Profile", link: EngineLink, *, context: dict | None = None,
               progress: Callable[[str, str], None] | None = None,
               patches: Callable[[], Awaitable] | None = None) -> "GateOutcome":
    """The profile's gate against the engine behind ``link``; ``context`` adds to what the report names
    (the profile and its hash always)."""
    from .gate import verdict

    return await verdict.run(profile, link.address, engine_key=link.key,
                             context={"profile": profile.name, "profile_hash": profile.fingerprint(),
                                      **(context or {})},
                             progress=progress, patches=patches)


@dataclass
class Served:
    """What ``serving`` yields: the engine, ready, and its gate's outcome (None where it was not gated)."""
    engine: StartedEngine
    outcome: "GateOutcome | None"

    @property
    def link(self) -> EngineLink:
        return self.engine.link


@contextlib.asynccontextmanager
async def serving(profile: "Profile", *, platform: str, engine: "Engine", deployment: str, log_path: Path,
                  image: str | None = None, group_access: bool = False, what: str = "the engine",
                  announce: Callable[[str], None] = lambda command: None,
                  gate_context: dict | None = None, stop_timeout: float = 30.0) -> AsyncIterator[Served]:
    """``profile``'s engine started, ready and (with ``gate_context``) gated for the body; stopped and its
    door closed afterwards, whatever happened."""
    door = open_door(group_access)
    started = None
    try:
        started = await start(profile, platform=platform, engine=engine, door=door, deployment=deployment,
                              log_path=log_path, image=image, announce=announce)
        await engine_link.wait_ready(door.link, profile.runtime.startup_timeout_s, alive=started.alive, what=what,
                         see=str(log_path))
        outcome = None if gate_context is None else await gate(profile, door.link, context=gate_context)
        yield Served(started, outcome)
    finally:
        if started is not None:
            await started.stop(stop_timeout)
        door.close()
