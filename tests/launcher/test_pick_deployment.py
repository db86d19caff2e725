"""Bare `radiance down` / `radiance logs` act on the one deployment that is running."""
from __future__ import annotations

import os

import pytest

from launcher import procs
from launcher.commands.logs import _pick
from launcher.errors import UsageError
from launcher.state import DeploymentState


def _state(name: str, live: bool, phase: str) -> DeploymentState:
    pid = os.getpid() if live else 2 ** 22 + 7          # this test's own process stands in for a supervisor
    st = DeploymentState(name=name, profile_path="p.yaml", profile_hash="h", runtime="local",
                         gateway_url="http://127.0.0.1:1", engine_url="unix:/x", supervisor_pid=pid,
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
    assert _pick(None).name == "now"


def test_two_running_is_ambiguous_and_names_only_those():
    _state("a", live=True, phase="ready")
    _state("b", live=True, phase="loading")
    _state("c", live=False, phase="stopped")
    with pytest.raises(UsageError, match=r"2 running deployments — fix: name one: a, b$"):
        _pick(None)


def test_nothing_running():
    with pytest.raises(UsageError, match="no deployments"):
        _pick(None)
    _state("only", live=False, phase="stopped")
    assert _pick(None).name == "only"                    # its logs are still worth reading
    _state("other", live=False, phase="stopped")
    with pytest.raises(UsageError, match="2 deployments — fix: name one"):
        _pick(None)


def test_a_name_is_taken_as_given():
    _state("a", live=False, phase="stopped")
    assert _pick("a").name == "a"
    with pytest.raises(UsageError, match="no deployment named 'zz'"):
        _pick("zz")
