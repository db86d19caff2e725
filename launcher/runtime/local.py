"""Runtime "local": the engine as a subprocess of this Python environment, in its own process group."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

from .. import engine_args, lifecycle, procs
from ..engine_link import EngineLink
from .base import Deployment, EngineHandle, EngineSpec, LinkedRuntime, follow_file


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _reap_group(pgid: int) -> None:
    """Collect every exited child in the group (the engine, and orphans we adopted as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class LocalEngine:
    name = "local"

    def __init__(self, subreaper: bool = True):
        # A Ray replica is no subreaper: Ray kills a dead worker's children, which would take the
        # engine's leash (launcher.procs.leash) along with it.
        self.subreaper = subreaper

    def start(self, spec: EngineSpec) -> EngineHandle:
        if self.subreaper:
            procs.become_subreaper()
        env = engine_args.process_env(spec.env, spec.secret_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        argv = engine_args.engine_argv(spec.server_args)
        log = None
        if spec.log_path is not None:
            spec.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(spec.log_path, "ab", buffering=0)
        # Own process group: stop() signals vLLM's engine-core and worker children too.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        if log is not None:
            log.close()
        return EngineHandle(runtime=self.name, ident=str(proc.pid), spec=spec)

    def alive(self, handle: EngineHandle) -> bool:
        return _pid_alive(int(handle.ident))

    def stop(self, handle: EngineHandle, timeout: float) -> None:
        pid = int(handle.ident)
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        # The API server first, then its engine core and workers, each given the time to exit by
        # itself (and be reaped by its parent) before anything is killed.
        while time.monotonic() < deadline:
            _reap_group(pid)
            if not any(state not in "ZX" for state in procs.group_members(pid).values()):
                break
            time.sleep(0.2)
        # Whatever is left of the group goes now.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        settle = time.monotonic() + 5.0
        while time.monotonic() < settle:
            _reap_group(pid)
            if not procs.group_members(pid):
                break
            time.sleep(0.05)

    def logs(self, handle: EngineHandle, follow: bool = False) -> Iterator[str]:
        yield from follow_file(handle.spec.log_path, follow, lambda: self.alive(handle))



class HostRuntime(LinkedRuntime):
    """An engine on this host, on a private socket with a key of the deployment's (launcher.engine_link):
    what local and docker share. Subclasses name their Engine and the image it runs, if any."""
    group_access = False            # the socket directory is the launcher's group's too (a container's user)

    def __init__(self) -> None:
        super().__init__()
        self.door: lifecycle.Door | None = None

    def new_engine(self):
        raise NotImplementedError

    def image(self, dep: Deployment) -> str | None:
        return None

    def open_link(self, dep: Deployment) -> EngineLink:
        self.door = lifecycle.open_door(group_access=self.group_access)
        return self.door.link

    async def start(self, dep: Deployment) -> None:
        dep.phase("starting", "resolving the model (a builtin model is generated on first use)")
        log_path = Path(dep.state.engine_log)

        def announce(command: str) -> None:
            with open(log_path, "a") as f:
                f.write(f"[radiance] {command}\n")

        started = await lifecycle.start(dep.profile, platform=dep.platform, engine=self.new_engine(), door=self.door,
                                        deployment=dep.name, log_path=log_path, image=self.image(dep),
                                        announce=announce)
        self.engine, self.handle = started.engine, started.handle
        dep.state.engine_ident = self.handle.ident
        dep.state.save()

    async def stop(self, dep: Deployment, timeout: float) -> None:
        if self.handle is not None:
            dep.phase("stopping", "stopping the engine")
            await asyncio.to_thread(self.engine.stop, self.handle, timeout)
        if self.door is not None:
            self.door.close()


class LocalRuntime(HostRuntime):
    kind = "local"
    hardware = "local"

    @classmethod
    def from_profile(cls, profile, **given) -> "LocalRuntime":
        return cls()

    def new_engine(self) -> LocalEngine:
        return LocalEngine()

    @classmethod
    def leftovers(cls, st) -> int:
        if not st.engine_ident.isdigit():
            return 0
        pid = int(st.engine_ident)
        try:  # a recycled pid must not be killed: only a vLLM server started by us
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"vllm.entrypoints" not in f.read():
                    return 0
        except OSError:
            return 0
        try:
            os.killpg(pid, signal.SIGKILL)  # the engine runs in its own process group
            return 1
        except (ProcessLookupError, PermissionError):
            return 0
