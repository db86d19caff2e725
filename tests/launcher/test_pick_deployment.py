"""Bare `radiance down` / `radiance logs` / `radiance gate` act on the one deployment that is running."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import procs
from launcher.cli import cli
from launcher.commands._common import pick_deployment
from launcher.errors import UsageError
from launcher.state import DeploymentState


TINY = str(Path(__file__).resolve().parents[2] / "profiles/tiny-cpu.yaml")


def _state(name: str, live: bool, phase: str) -> DeploymentState:
    pid = os.getpid() if live else 2 ** 22 + 7          # this test's own process stands in for a supervisor
    st = DeploymentState(name=name, profile_path=TINY, profile_hash="h", runtime="local",
                         gateway_url="http://127.0.0.1:9", engine_url="unix:/x", supervisor_pid=pid,
                         supervisor_started=procs.start_time(pid) if live else None, phase=phase)
    st.save()
    return st


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path))


def test_one_running_beside_stopped_ones_is_the_one():
    _state("old", live=False, phase="stopped")
    _state("now", live=True, phase="ready")
    _state("older", live=False, phase="stopped")
    assert pick_deployment(None).name == "now"


def test_two_running_is_ambiguous_and_names_only_those():
    _state("a", live=True, phase="ready")
    _state("b", live=True, phase="loading")
    _state("c", live=False, phase="stopped")
    with pytest.raises(UsageError, match=r"2 running deployments — fix: name one: a, b$"):
        pick_deployment(None)


def test_nothing_running():
    with pytest.raises(UsageError, match="no deployments"):
        pick_deployment(None)
    _state("only", live=False, phase="stopped")
    assert pick_deployment(None).name == "only"                    # its logs are still worth reading
    _state("other", live=False, phase="stopped")
    with pytest.raises(UsageError, match="2 deployments — fix: name one"):
        pick_deployment(None)


def test_a_name_is_taken_as_given():
    _state("a", live=False, phase="stopped")
    assert pick_deployment("a").name == "a"
    with pytest.raises(UsageError, match="no deployment named 'zz'"):
        pick_deployment("zz")


def test_live_only_refuses_a_stopped_one():
    _state("only", live=False, phase="stopped")
    with pytest.raises(UsageError, match="no deployment is running"):
        pick_deployment(None, live_only=True)
    _state("now", live=True, phase="ready")
    assert pick_deployment(None, live_only=True).name == "now"


def _gate(*args):
    env = {"RADIANCE_PROFILE": None, "RADIANCE_GATE_URL": None}
    return CliRunner().invoke(cli, ["gate", *args], catch_exceptions=False, env=env)


def test_bare_gate_gates_the_running_deployments_gateway():
    _state("old", live=False, phase="stopped")
    _state("now", live=True, phase="ready")
    res = _gate()                         # its gateway (port 9) answers nothing: unreachable, exit 5
    assert res.exit_code == 5 and "endpoint http://127.0.0.1:9 unreachable" in res.output, res.output
    res = _gate("now")                    # by its name: the same
    assert res.exit_code == 5 and "http://127.0.0.1:9" in res.output, res.output


def test_bare_gate_with_two_running_is_ambiguous():
    _state("a", live=True, phase="ready")
    _state("b", live=True, phase="gating")
    res = _gate()
    assert res.exit_code == 2 and "2 running deployments — fix: name one: a, b" in res.output, res.output
    res = _gate("--record-reference")
    assert res.exit_code == 2 and "--record-reference needs PROFILE" in res.output, res.output
