"""The supervisor's state machine, driven through the runtime seam by a fake runtime with a fake engine
(nothing is started; the gate's verdict is stubbed): starting -> loading -> gating -> ready | unready |
failed -> stopping -> stopped, the exit codes, a gate failure, an engine that dies. Real engines:
tests/e2e/test_spine.py (local), tests/docker/test_up_docker.py, tests/e2e/test_ray_serve.py."""
from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from launcher import errors
from launcher.engine_link import EngineLink
from launcher.gate import verdict
from launcher.profile import load_profile
from launcher.runtime.base import Phase
from launcher.state import DeploymentState
from launcher.supervisor import Supervisor, UpOptions

REPO = Path(__file__).resolve().parents[2]


class FakeGateway:
    """launcher.gateway.Gateway's lifecycle, without a socket: its drain sets the "draining" phase."""

    def __init__(self, state, drain_timeout: float):
        self.state, self.drain_timeout = state, drain_timeout
        self.calls: list[str] = []

    async def start(self, host: str, port: int) -> None:
        self.calls.append("start")

    async def drain(self) -> None:
        self.calls.append(f"drain after {self.state.phase}")
        self.state.set("draining", "shutting down")

    async def stop(self) -> None:
        self.calls.append("stop")

    async def engine_report(self):
        return None


class FakeEngineRuntime:
    """Implements launcher.runtime.base.Runtime around a fake engine: ``serve_for`` status polls, then the
    engine dies (``dies``) or a stop is asked for."""
    kind = "fake"
    takes: tuple = ()
    refuses: dict = {}
    hardware = "local"

    def __init__(self, *, dies_loading=False, dies=False, serve_for=2, own_verdict: Phase | None = None):
        self.link = EngineLink("http://127.0.0.1:9", "engine-key")
        self.engine_url = self.link.address
        self.dies_loading, self.dies, self.serve_for, self.own_verdict = dies_loading, dies, serve_for, own_verdict
        self.calls: list[str] = []
        self.gw: FakeGateway | None = None

    @classmethod
    def from_profile(cls, profile, **given):
        return cls()

    def elsewhere(self):
        return None

    def argv(self):
        return ()

    def gateway(self, dep, state, **kwargs):
        self.gw = FakeGateway(state, kwargs["drain_timeout"])
        return self.gw

    async def start(self, dep):
        self.calls.append("start")
        dep.state.engine_ident = "fake-1"

    async def ready(self, dep):
        dep.phase("loading", "engine loading")
        if self.dies_loading:
            raise errors.LauncherError("the engine exited while loading")
        return self.own_verdict

    async def status(self, dep):
        self.calls.append("status")
        if self.calls.count("status") >= self.serve_for:
            if self.dies:
                return Phase("failed", "the engine exited unexpectedly", exit_code=errors.RUNTIME_ERROR)
            dep.stopping.set()          # what SIGTERM from `radiance down` does
        return None

    async def stop(self, dep, timeout):
        self.calls.append("stop")
        dep.phase("stopping", "stopping the engine")

    @classmethod
    def logs(cls, st, follow, tail):
        return iter(())

    @classmethod
    def leftovers(cls, st):
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def profile(isolated_home):
    p = load_profile(REPO / "profiles/tiny-cpu.yaml")
    return p.model_copy(update={"server": p.server.model_copy(update={"port": _free_port()})})


@pytest.fixture
def gate(monkeypatch):
    """The gate's verdict, stubbed: ``gate.passed`` decides it; ``gate.runs`` counts the calls."""
    class Gate:
        passed = True
        runs = 0

    async def run(profile, engine_url, *, context, engine_key=None, progress=None, patches=None):
        Gate.runs += 1
        assert engine_url == "http://127.0.0.1:9" and engine_key == "engine-key"
        return verdict.GateOutcome(passed=Gate.passed, reason="passed" if Gate.passed else "acceptance 1.1 < 1.7",
                                   report_path="/r.json", summary={"passed": Gate.passed})

    monkeypatch.setattr(verdict, "run", run)
    return Gate


def _run(profile, runtime, **opts):
    seen: list[tuple[str, str]] = []
    sup = Supervisor(profile, str(REPO / "profiles/tiny-cpu.yaml"), UpOptions(platform="cpu", **opts), runtime,
                     progress=lambda phase, detail: seen.append((phase, detail)))
    try:
        code = asyncio.run(sup.run())
    except errors.LauncherError as exc:
        code = exc
    phases = [p for i, (p, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != p]
    return code, phases, seen, DeploymentState.load(profile.name)


def test_gate_passes_serves_until_stopped(profile, gate):
    rt = FakeEngineRuntime()
    code, phases, seen, st = _run(profile, rt)
    assert code == errors.OK
    assert phases == ["starting", "loading", "gating", "ready", "stopping", "stopped"]
    assert ("ready", "gate passed") in seen and gate.runs == 1
    assert rt.calls == ["start", "status", "status", "stop"]
    assert rt.gw.calls == ["start", "drain after ready", "stop"]        # drained before the engine stops
    assert st.phase == "stopped" and st.exit_code == 0 and st.runtime == "fake" and st.engine_ident == "fake-1"
    assert st.engine_url == "http://127.0.0.1:9" and st.gate_report == "/r.json"


def test_gate_failure_stops_with_exit_3(profile, gate):
    gate.passed = False
    rt = FakeEngineRuntime()
    code, phases, seen, st = _run(profile, rt)
    assert code == errors.GATE_FAILED
    assert phases == ["starting", "loading", "gating", "unready", "stopping", "stopped"]
    assert ("unready", "gate failed: acceptance 1.1 < 1.7") in seen
    assert "status" not in rt.calls and rt.calls[-1] == "stop"
    assert st.exit_code == errors.GATE_FAILED and not st.ready and rt.gw.calls[1] == "drain after unready"


def test_gate_failure_kept_serving_unready(profile, gate):
    gate.passed = False
    rt = FakeEngineRuntime()
    code, phases, _, st = _run(profile, rt, keep_serving_unready=True)
    assert code == errors.GATE_FAILED and rt.calls.count("status") == 2
    assert phases == ["starting", "loading", "gating", "unready", "stopping", "stopped"]


def test_skip_gate_is_ready_without_a_gate(profile, gate):
    code, phases, seen, _ = _run(profile, FakeEngineRuntime(), skip_gate=True)
    assert code == errors.OK and gate.runs == 0
    assert phases == ["starting", "loading", "ready", "stopping", "stopped"]
    assert ("ready", "gate skipped by --skip-gate") in seen


def test_engine_death_while_serving_fails_with_exit_1(profile, gate):
    rt = FakeEngineRuntime(dies=True)
    code, phases, seen, st = _run(profile, rt)
    assert code == errors.RUNTIME_ERROR
    assert phases == ["starting", "loading", "gating", "ready", "failed", "stopping", "stopped"]
    assert ("failed", "the engine exited unexpectedly") in seen
    assert st.exit_code == errors.RUNTIME_ERROR and rt.calls[-1] == "stop" and rt.gw.calls[1] == "drain after failed"


def test_engine_death_while_loading_is_a_launcher_error(profile, gate):
    rt = FakeEngineRuntime(dies_loading=True)
    code, phases, seen, st = _run(profile, rt)
    assert isinstance(code, errors.LauncherError) and gate.runs == 0
    assert phases == ["starting", "loading", "failed", "stopping", "stopped"]
    assert ("failed", "the engine exited while loading") in seen and rt.calls[-1] == "stop"


def test_a_runtime_that_gates_its_own_engines(profile, gate):
    """ray's way: ready() returns the replicas' verdict, and the supervisor runs no gate of its own."""
    failed = Phase("unready", "no replica passed its gate: acceptance", exit_code=errors.GATE_FAILED)
    code, phases, _, _ = _run(profile, FakeEngineRuntime(own_verdict=failed))
    assert code == errors.GATE_FAILED and gate.runs == 0
    assert phases == ["starting", "loading", "unready", "stopping", "stopped"]
    passed = Phase("ready", "2/2 replicas passed their gate", ready=True)
    code, phases, _, _ = _run(profile, FakeEngineRuntime(own_verdict=passed))
    assert code == errors.OK and gate.runs == 0
    assert phases == ["starting", "loading", "ready", "stopping", "stopped"]


def test_every_registered_runtime_implements_the_seam():
    from launcher.runtime import RUNTIMES, runtime_class

    seam = ("from_profile", "elsewhere", "argv", "gateway", "start", "ready", "status", "stop", "logs",
            "leftovers")
    for kind in RUNTIMES:
        cls = runtime_class(kind)
        assert cls.kind == kind and isinstance(cls.takes, tuple) and isinstance(cls.refuses, dict)
        missing = [m for m in seam if not callable(getattr(cls, m, None))]
        assert not missing, f"{kind}: {missing}"
