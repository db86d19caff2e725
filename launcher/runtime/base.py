"""Where a deployment's engine runs: one seam, ``Runtime``, that local, docker, ray and external implement.

Two layers:

- ``Runtime``: what the supervisor drives for one deployment. ``gateway`` opens the engine's door and
  returns the public side in front of it, ``start`` starts the engine(s) and returns at once, ``ready``
  waits until they answer, ``status`` is asked every second while serving, ``stop`` leaves nothing
  running. From a deployment's saved state alone (another process: `radiance logs`, `radiance down`),
  ``logs`` reads what the engine wrote and ``leftovers`` removes what a dead supervisor left behind.
  The kinds are registered in launcher/runtime/__init__.py.
- ``Engine``: one vLLM API server process somewhere (``LocalEngine``: a subprocess; ``DockerEngine``: a
  container). The engine serves on a Unix socket in ``spec.socket_dir`` (launcher.engine_link), never on
  a TCP port. The runtimes of this host use one; a Ray replica uses ``LocalEngine`` on its node.

The gateway and the gate always run in the supervisor's process on the host.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Protocol

from .. import engine_link, errors
from ..engine_link import EngineLink

if TYPE_CHECKING:
    from ..engine_args import EngineConfig
    from ..gateway import Gateway, GatewayState
    from ..profile import Profile
    from ..state import DeploymentState


@dataclass
class EngineSpec:
    deployment: str                 # name of the deployment (profile name unless overridden)
    server_args: list[str]          # arguments after `python -m vllm.entrypoints.openai.api_server`
    env: dict[str, str]             # RADIANCE_* knobs and VLLM_* settings for the engine processes
    platform: str                   # a name in launcher/platforms.py
    log_path: Path | None           # engine stdout/stderr go here (host path); None: ours (a Ray replica's)
    model_dir: Path | None = None   # a local model directory (mounted read-only into containers)
    extra_dirs: tuple[Path, ...] = ()  # other local checkpoints (a drafter), mounted read-only too
    socket_dir: Path | None = None  # private directory holding the engine's socket (engine_link)
    image: str | None = None        # docker runtime: the image to run
    secret_env: dict[str, str] = field(default_factory=dict)  # HF_TOKEN etc.: passed, never logged

    @classmethod
    def of(cls, cfg: "EngineConfig", *, deployment: str, platform: str, log_path: Path | None,
           socket_dir: Path | None = None, image: str | None = None) -> "EngineSpec":
        """The spec of the engine ``cfg`` (launcher.engine_args.from_profile) describes."""
        return cls(deployment=deployment, server_args=cfg.server_args, env=cfg.env, platform=platform,
                   log_path=log_path, model_dir=cfg.model_dir, extra_dirs=cfg.extra_dirs,
                   socket_dir=socket_dir, image=image, secret_env=cfg.secret_env)


@dataclass
class EngineHandle:
    runtime: str                    # "local" | "docker"
    ident: str                      # pid (local) or container id (docker)
    spec: EngineSpec


class Engine(Protocol):
    name: str

    def start(self, spec: EngineSpec) -> EngineHandle:
        """Start the engine and return at once (the caller waits for readiness over HTTP)."""

    def alive(self, handle: EngineHandle) -> bool: ...

    def stop(self, handle: EngineHandle, timeout: float) -> None:
        """SIGTERM, wait up to timeout, then kill; leaves nothing running."""

    def logs(self, handle: EngineHandle, follow: bool = False) -> Iterator[str]: ...


@dataclass
class Phase:
    """A phase the deployment moves to, as a runtime sees it (``ready``'s verdict, ``status``'s change)."""
    phase: str                      # ready | unready | failed
    reason: str
    ready: bool = False
    exit_code: int | None = None    # the deployment's exit code from now on (None: unchanged)


class Deployment(Protocol):
    """What a runtime sees of the supervisor driving it (launcher.supervisor.Supervisor)."""
    name: str
    profile: "Profile"
    platform: str
    state: "DeploymentState"
    gw_state: "GatewayState"
    stopping: asyncio.Event

    def phase(self, phase: str, reason: str = "", ready: bool = False) -> None: ...

    def reclaim_signals(self) -> None:
        """Install the supervisor's SIGTERM/SIGINT handlers again (a library replaced them)."""


class Runtime(Protocol):
    kind: ClassVar[str]
    takes: ClassVar[tuple[str, ...]]        # `radiance up` options that only this runtime takes
    refuses: ClassVar[dict[str, str]]       # `radiance up` options that do not apply to it, and why
    hardware: ClassVar[str]                 # whose hardware verdict applies before it starts (`radiance check`)
    engine_url: str                         # what the deployment's state records (after ``gateway``)
    link: EngineLink | None                 # the engine the supervisor gates (None: the runtime gates itself)

    @classmethod
    def from_profile(cls, profile: "Profile", **given) -> "Runtime":
        """The runtime with its options: the profile's ``runtime`` section, overridden by what `radiance up`
        was given on its command line (``given``: option name -> value, None where not given)."""

    def elsewhere(self) -> str | None:
        """Where the engines run when that is not this machine (their platform must then be stated)."""

    def argv(self) -> tuple[str, ...]:
        """The `radiance up` options that build this runtime again (for the detached supervisor)."""

    def gateway(self, dep: Deployment, state: "GatewayState", **kwargs) -> "Gateway":
        """Open the engine's door (a private socket and key, a cluster handle) and return the gateway
        in front of it; ``engine_url`` is known from here on."""

    async def start(self, dep: Deployment) -> None:
        """Start the engine(s) and return at once."""

    async def ready(self, dep: Deployment) -> Phase | None:
        """Wait until the engine answers (raises LauncherError when it dies or times out). None: the
        supervisor gates ``link``; a Phase: the runtime's engines gated themselves, and this is how that
        went (also None when a stop was asked for meanwhile)."""

    async def status(self, dep: Deployment) -> Phase | None:
        """Asked every second while serving: a change of phase (a ``failed`` one ends the serving), or None."""

    async def stop(self, dep: Deployment, timeout: float) -> None:
        """Stop whatever ``start`` started (each stop says its phase); leaves nothing running."""

    @classmethod
    def logs(cls, st: "DeploymentState", follow: bool, tail: int | None) -> Iterator[str]:
        """The engine's output, from the deployment's state (its supervisor may be gone)."""

    @classmethod
    def leftovers(cls, st: "DeploymentState") -> int:
        """Stop what a supervisor that died left running; returns how many engines (or applications)."""


# -- the shared part of the runtimes whose engine is one link away ------------------------------------

class LinkedRuntime:
    """An engine behind one EngineLink, gated by the supervisor: ``start`` and ``stop`` are the subclass's;
    readiness is the engine's /health, and its output is the deployment's engine.log."""
    takes: ClassVar[tuple[str, ...]] = ()
    refuses: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self.link: EngineLink | None = None
        self.handle: EngineHandle | None = None
        self.engine: Engine | None = None

    @property
    def engine_url(self) -> str:
        return self.link.address

    def elsewhere(self) -> str | None:
        return None

    def argv(self) -> tuple[str, ...]:
        return ()

    def open_link(self, dep: Deployment) -> EngineLink:
        raise NotImplementedError

    def gateway(self, dep: Deployment, state: "GatewayState", **kwargs) -> "Gateway":
        from ..gateway import Gateway

        self.link = self.open_link(dep)
        return Gateway(self.link, state, **kwargs)

    async def _alive(self) -> bool:
        # The docker engine asks the daemon: never on the event loop the gateway serves from.
        return self.handle is None or await asyncio.to_thread(self.engine.alive, self.handle)

    async def ready(self, dep: Deployment) -> Phase | None:
        dep.phase("loading", "engine loading")
        timeout = dep.profile.runtime.startup_timeout_s

        def waiting(seconds: float) -> None:
            dep.phase("loading", f"engine loading, {seconds:.0f}s — {last_log_line(dep.state.engine_log)}")
            if dep.stopping.is_set():
                raise asyncio.CancelledError

        await engine_link.wait_ready(self.link, timeout, alive=self._alive, waiting=waiting,
                                     see=f"`radiance logs {dep.name}` ({dep.state.engine_log})")
        return None

    async def status(self, dep: Deployment) -> Phase | None:
        if self.handle is not None and not await self._alive():
            return Phase("failed", "the engine exited unexpectedly", exit_code=errors.RUNTIME_ERROR)
        return None

    @classmethod
    def logs(cls, st: "DeploymentState", follow: bool, tail: int | None) -> Iterator[str]:
        # local and docker both write the engine's output to this file (docker mirrors the container's logs).
        return log_file_lines(st.engine_log, st, follow, tail)

    @classmethod
    def leftovers(cls, st: "DeploymentState") -> int:
        return 0


def last_log_line(path: str) -> str:
    """The last non-empty line of a log (loading progress), cut to 160 characters."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-160:] if lines else ""


def follow_file(path, follow: bool, alive: Callable[[], bool]) -> Iterator[str]:
    try:
        f = open(path, "r", errors="replace")
    except FileNotFoundError:
        return
    with f:
        while True:
            line = f.readline()
            if line:
                yield line.rstrip("\n")
                continue
            if not follow or not alive():
                return
            time.sleep(0.25)


def log_file_lines(path: str, st: "DeploymentState", follow: bool, tail: int | None) -> Iterator[str]:
    """A deployment's log file: all of it or its last ``tail`` lines, then (``follow``) what is appended
    while its supervisor lives."""
    if tail is None:
        yield from follow_file(path, follow=follow, alive=st.supervisor_alive)
        return
    yield from deque(follow_file(path, follow=False, alive=lambda: False), maxlen=tail)
    if not follow:
        return
    with open(path, errors="replace") as f:
        f.seek(0, os.SEEK_END)
        while st.supervisor_alive():
            line = f.readline()
            if line:
                yield line.rstrip("\n")
            else:
                time.sleep(0.25)
