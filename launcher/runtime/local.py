"""The engine as a subprocess of this Python environment."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterator

from .. import procs
from .base import EngineHandle, EngineSpec


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


def _become_subreaper() -> None:
    """Linux: orphans of the engine (a worker whose parent, the engine core, went first) become our
    children instead of init's, so stop() reaps them and none lingers as a zombie where init does not
    reap (containers without an init, sandboxes)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap_group(pgid: int) -> None:
    """Collect every exited child in the group (the engine, and orphans we adopted as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class LocalRuntime:
    name = "local"

    def __init__(self, subreaper: bool = True):
        # A Ray replica is no subreaper: Ray kills a dead worker's children, which would take the
        # engine's leash (launcher.procs.leash) along with it.
        self.subreaper = subreaper

    def start(self, spec: EngineSpec) -> EngineHandle:
        if self.subreaper:
            _become_subreaper()
        env = dict(os.environ)
        env.update(spec.env)
        env.update(spec.secret_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *spec.server_args]
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


def follow_file(path, follow: bool, alive) -> Iterator[str]:
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
