"""How the launcher reaches its own engine, and nothing else does.

vLLM's ``--api-key`` guards only ``/v1``-style prefixes: ``/invocations`` (SageMaker's route, the
same generation as ``/v1``), ``/tokenize``, ``/metrics`` and more answer anyone who can connect. So
a key alone does not stop a bypass of the gate; what does is that nobody else can connect. The
engine therefore serves on a Unix socket (vLLM's ``--uds``) inside a directory only the launcher's
user can enter, and it holds a per-deployment key (``VLLM_API_KEY``, never on a command line)
that the gateway and the gate send, for the ``/v1`` paths, as a second lock.

An engine address is a string: ``unix:/abs/path.sock`` or ``http://host:port`` (an engine someone
else runs, `radiance gateway --engine-url`).
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from . import errors

UNIX = "unix:"
SOCKET_NAME = "engine.sock"
KEY_ENV = "VLLM_API_KEY"          # vLLM's own variable for --api-key
# Seen through a Unix socket, the engine's host name is a formality.
_UDS_BASE = "http://engine"
# AF_UNIX paths are limited to 108 bytes on Linux; deployment directories can be deeper.
_UDS_MAX = 100


def new_key() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class EngineLink:
    address: str                 # unix:/path or http://host:port
    key: str | None = None       # sent as a bearer token upstream; never logged

    @property
    def uds(self) -> str | None:
        return self.address[len(UNIX):] if self.address.startswith(UNIX) else None

    @property
    def base_url(self) -> str:
        """What goes before a path in a request (the socket path travels in the connector)."""
        return _UDS_BASE if self.uds else self.address.rstrip("/")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def aiohttp_connector(self, limit: int = 0):
        """limit=0: no pool cap (aiohttp's default of 100 would queue the 101st stream)."""
        import aiohttp

        if self.uds:
            return aiohttp.UnixConnector(path=self.uds, limit=limit)
        return aiohttp.TCPConnector(limit=limit)


class EngineExited(RuntimeError):
    """The engine process ended while we waited for it to answer."""


class EngineTimeout(RuntimeError):
    """The engine did not answer /health in time."""


async def wait_healthy(link: EngineLink, timeout: float, *, alive: Callable[[], Awaitable[bool]],
                       waiting: Callable[[float], None] | None = None) -> None:
    """Poll the engine's /health once a second until it answers 200. ``alive`` says whether its
    process still runs (EngineExited when not); ``waiting(seconds)`` is told each second it is not
    up yet (and may raise to stop the wait)."""
    import asyncio

    import aiohttp

    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5),
                                     connector=link.aiohttp_connector()) as s:
        while True:
            if not await alive():
                raise EngineExited("the engine exited while loading")
            try:
                async with s.get(link.base_url + "/health") as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if time.monotonic() - t0 > timeout:
                raise EngineTimeout(f"the engine was not healthy after {timeout:.0f}s")
            if waiting is not None:
                waiting(time.monotonic() - t0)
            await asyncio.sleep(1.0)


async def wait_ready(link: EngineLink, timeout: float, *, alive: Callable[[], Awaitable[bool]],
                     waiting: Callable[[float], None] | None = None, what: str = "the engine",
                     see: str = "its log") -> None:
    """``wait_healthy``, its failures said as a LauncherError naming ``what`` did not come up and what to
    look at (``see``)."""
    try:
        await wait_healthy(link, timeout, alive=alive, waiting=waiting)
    except EngineExited:
        raise errors.LauncherError(f"{what} exited while loading; see {see}") from None
    except EngineTimeout:
        raise errors.LauncherError(f"{what} was not healthy after {timeout:.0f}s — fix: raise "
                                   f"runtime.startup_timeout_s or see {see}") from None


def private_socket_dir(group_access: bool = False) -> Path:
    """A fresh directory for the engine's socket that only this user (and, with group_access, this
    user's group: a container's user that is not us) can enter."""
    root = os.environ.get("XDG_RUNTIME_DIR")
    if not root or not os.path.isdir(root) or len(root) > _UDS_MAX - 40:
        root = tempfile.gettempdir()
    d = Path(tempfile.mkdtemp(prefix="radiance-", dir=root))  # mode 0700
    if group_access:
        # setgid: the socket a container creates here belongs to our group, so we may connect to it.
        os.chmod(d, 0o2770)
    if len(str(d / SOCKET_NAME)) > _UDS_MAX:
        raise OSError(f"socket path {d / SOCKET_NAME} is too long for AF_UNIX; set TMPDIR shorter")
    return d


def remove_socket_dir(d: Path | str | None) -> None:
    if d:
        shutil.rmtree(d, ignore_errors=True)


def write_key_file(path: Path | str, key: str) -> None:
    """Atomically, readable by this user only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    os.replace(tmp, path)


def read_key_file(path: Path | str) -> str:
    key = Path(path).read_text().strip()
    if not key:
        raise ValueError(f"{path} is empty")
    return key
