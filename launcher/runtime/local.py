"""The engine as a subprocess of this Python environment."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Iterator

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


class LocalRuntime:
    name = "local"

    def start(self, spec: EngineSpec) -> EngineHandle:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(spec.env)
        env.update(spec.secret_env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *spec.server_args]
        log = open(spec.log_path, "ab", buffering=0)
        # Own process group: stop() signals vLLM's engine-core and worker children too.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
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
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                break
            time.sleep(0.2)
        # Whatever is left of the group (workers that outlived the API server) goes now.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _pid_alive(pid)

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
