"""`radiance down` waits as long as the deployment's own shutdown may take before it kills: a fixed
120 s cut the streams of a deployment whose drain budget was longer (its SIGKILL landed mid-drain).
The supervisors here are real processes standing in for one (a supervisor's own drain is tested in
tests/launcher/test_gateway_fake_upstream.py and tests/e2e/test_keyed_load_down.py)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import procs
from launcher.cli import cli
from launcher.commands.down import shutdown_budget
from launcher.state import DeploymentState

TINY = str(Path(__file__).resolve().parents[2] / "profiles/tiny-cpu.yaml")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path))


def _state(pid: int | None, drain: float | None) -> DeploymentState:
    st = DeploymentState(name="d", profile_path=TINY, profile_hash="h", runtime="local",
                         gateway_url="http://127.0.0.1:9", engine_url="unix:/x",
                         supervisor_pid=pid or 2 ** 22 + 7,
                         supervisor_started=procs.start_time(pid) if pid else None,
                         phase="ready", drain_timeout_s=drain)
    st.save()
    return st


def test_the_budget_is_the_drain_then_the_engine_stop_plus_room():
    assert shutdown_budget(_state(None, None)) == 120.0      # a state written before the budget was recorded
    assert shutdown_budget(_state(None, 30.0)) == 120.0      # the default drain: as before
    assert shutdown_budget(_state(None, 600.0)) == 1260.0    # drain 600 + engine stop 600 + 60
    assert shutdown_budget(_state(None, 0.0)) == 120.0


def _supervisor(on_term: str) -> subprocess.Popen:
    """A process that, on SIGTERM, exits after 1.5 s ('slow') or not at all ('stubborn')."""
    body = {"slow": "time.sleep(1.5); sys.exit(0)", "stubborn": "pass"}[on_term]
    code = (f"import signal, sys, time\n"
            f"def on_term(*_):\n    {body}\n"
            f"signal.signal(signal.SIGTERM, on_term)\nprint('up', flush=True)\n"
            f"while True:\n    time.sleep(0.1)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


def test_a_supervisor_still_draining_is_waited_for():
    proc = _supervisor("slow")
    try:
        _state(proc.pid, 30.0)
        # the supervisor exits; nobody reaps it but us, and an unreaped supervisor counts as gone
        r = CliRunner().invoke(cli, ["down", "d"])
        assert r.exit_code == 0, r.output
        assert "d: stopped" in r.output
    finally:
        proc.kill()
        proc.wait()


def test_past_its_timeout_it_kills_and_says_how_to_wait_longer():
    proc = _supervisor("stubborn")
    try:
        _state(proc.pid, 30.0)
        t0 = time.monotonic()
        r = CliRunner().invoke(cli, ["down", "d", "--timeout", "1"])
        assert r.exit_code == 1, r.output
        assert "did not stop within 1s; killed" in r.output and "--timeout" in r.output
        assert time.monotonic() - t0 < 30
        assert proc.wait(timeout=10) == -9
    finally:
        proc.kill()
        proc.wait()


def test_a_negative_timeout_is_a_usage_error():
    r = CliRunner().invoke(cli, ["down", "d", "--timeout", "-1"])
    assert r.exit_code == 2 and "--timeout" in r.output
