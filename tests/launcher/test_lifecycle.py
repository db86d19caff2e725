"""launcher/lifecycle.py: a profile to a started engine behind a private door, to ready, to gated, to stopped.

The engine is a real process: a small aiohttp server standing in for vLLM's (the real one is covered by
tests/e2e, the supervisor spine), answering /health on the socket the door gives it, after the key
check vLLM's --api-key does for /v1 routes. The gate's verdict is stubbed (it has tests of its own)."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from launcher import errors, lifecycle
from launcher.gate import verdict
from launcher.profile import load_profile
from launcher.runtime.base import EngineHandle, EngineSpec

REPO = Path(__file__).resolve().parents[2]

# Serves /health on --uds after ``delay`` seconds, or exits at once with ``delay`` < 0.
STAND_IN = """
import asyncio, sys
from aiohttp import web
uds, delay = sys.argv[1], float(sys.argv[2])
if delay < 0:
    sys.exit(3)
async def main():
    await asyncio.sleep(delay)
    app = web.Application()
    app.router.add_get("/health", lambda request: web.Response(text=""))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, uds).start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


class StandInEngine:
    """``launcher.runtime.base.Engine`` over a process of ours: what the spec says, not what it runs."""

    name = "stand-in"

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.specs: list[EngineSpec] = []
        self.stopped: list[str] = []

    def start(self, spec: EngineSpec) -> EngineHandle:
        self.specs.append(spec)
        uds = spec.server_args[spec.server_args.index("--uds") + 1]
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN, uds, str(self.delay)], start_new_session=True)
        self.proc = proc
        return EngineHandle(runtime=self.name, ident=str(proc.pid), spec=spec)

    def alive(self, handle: EngineHandle) -> bool:
        return self.proc.poll() is None

    def stop(self, handle: EngineHandle, timeout: float) -> None:
        self.stopped.append(handle.ident)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout)

    def logs(self, handle, follow=False):
        return iter(())


@pytest.fixture
def profile(isolated_home):
    p = load_profile(REPO / "profiles/tiny-cpu.yaml")
    return p.model_copy(update={"runtime": p.runtime.model_copy(update={"startup_timeout_s": 20})})


@pytest.fixture
def gate(monkeypatch):
    seen = []

    async def run(profile, engine_url, *, context, engine_key=None, progress=None, patches=None):
        seen.append((engine_url, engine_key, context))
        return verdict.GateOutcome(passed=True, reason="passed", report_path="/r.json", summary={})

    monkeypatch.setattr(verdict, "run", run)
    return seen


async def _health(link) -> int:
    async with aiohttp.ClientSession(connector=link.aiohttp_connector()) as s:
        async with s.get(link.base_url + "/health") as r:
            return r.status


def test_serving_starts_the_profiles_engine_waits_gates_and_stops_it(profile, gate, tmp_path):
    engine = StandInEngine(delay=1.5)          # not up at once: the wait must wait
    log_path = tmp_path / "engine.log"
    announced = []

    async def go():
        async with lifecycle.serving(profile, platform="cpu", engine=engine, deployment="d", log_path=log_path,
                                     announce=announced.append, gate_context={"replica": "r1"}) as served:
            assert await _health(served.link) == 200
            door = served.engine.handle.spec.socket_dir
            assert door.is_dir() and (door.stat().st_mode & 0o777) == 0o700
            return served, door

    served, door = asyncio.run(go())
    spec = engine.specs[0]
    # the profile's own engine: engine_args.from_profile's command, with the door's socket and key
    assert "--served-model-name" in spec.server_args and spec.server_args[spec.server_args.index("--uds") + 1] \
        == served.link.uds
    assert spec.secret_env.get("VLLM_API_KEY") == served.link.key and served.link.key not in announced[0]
    assert served.outcome.passed and gate == [(served.link.address, served.link.key,
                                               {"profile": profile.name, "profile_hash": profile.fingerprint(),
                                                "replica": "r1"})]
    assert engine.stopped == [served.engine.handle.ident] and engine.proc.poll() is not None
    assert not door.exists()


def test_an_engine_that_exits_while_loading_is_a_launcher_error_and_leaves_nothing(profile, gate, tmp_path):
    engine = StandInEngine(delay=-1)

    async def go():
        async with lifecycle.serving(profile, platform="cpu", engine=engine, deployment="d",
                                     log_path=tmp_path / "stock.log", what="the stock engine"):
            raise AssertionError("not reached")

    with pytest.raises(errors.LauncherError, match=r"the stock engine exited while loading; see .*stock\.log"):
        asyncio.run(go())
    assert engine.stopped and not engine.specs[0].socket_dir.exists() and gate == []


def test_an_engine_that_never_answers_times_out_with_the_fix(profile, gate, tmp_path):
    profile = profile.model_copy(update={"runtime": profile.runtime.model_copy(update={"startup_timeout_s": 1})})
    engine = StandInEngine(delay=30)

    async def go():
        async with lifecycle.serving(profile, platform="cpu", engine=engine, deployment="d",
                                     log_path=tmp_path / "e.log"):
            raise AssertionError("not reached")

    with pytest.raises(errors.LauncherError, match="not healthy after 1s — fix: raise runtime.startup_timeout_s"):
        asyncio.run(go())
    assert engine.proc.poll() is not None and not engine.specs[0].socket_dir.exists()
