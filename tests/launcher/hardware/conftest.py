"""Fixture trees for the hardware probe.

Each ``fixtures/<scenario>/`` is a captured filesystem root (``sys/``, ``dev/``, ``proc/``,
``etc/``) plus ``commands/<tool>.txt``, the text that tool printed on that machine, which
``ReplayRunner`` hands back instead of running it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from launcher.hardware._proc import CommandResult

FIXTURES = Path(__file__).parent / "fixtures"
FAKE_LIBS = FIXTURES / "_fake_libs"


class ReplayRunner:
    """Answers ``argv`` with ``commands/<argv[0]>.txt``; a missing file means the tool is not installed.

    ``overrides`` maps a tool to a CommandResult (or a list of them, one per call) for failure cases.
    """

    def __init__(self, scenario: Path | None, overrides: dict | None = None):
        self.scenario = scenario
        self.overrides = {k: list(v) if isinstance(v, list) else v for k, v in (overrides or {}).items()}
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        tool = os.path.basename(argv[0])
        if tool in self.overrides:
            o = self.overrides[tool]
            return o.pop(0) if isinstance(o, list) else o
        path = self.scenario / "commands" / f"{tool}.txt" if self.scenario else None
        if path is None or not path.exists():
            return CommandResult(argv, None, failure="not_found")
        return CommandResult(argv, 0, path.read_text(), "")


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def replay():
    return ReplayRunner


@pytest.fixture
def copy_scenario(tmp_path):
    """A writable copy of a scenario, for variations (a device node removed, a driver added)."""

    def _copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(FIXTURES / name, dest)
        return dest

    return _copy


@pytest.fixture
def fake_libs(monkeypatch):
    """Make the stand-in amdsmi/pynvml importable here and in the probe's child interpreter."""
    monkeypatch.syspath_prepend(str(FAKE_LIBS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAKE_LIBS), os.environ.get("PYTHONPATH")])))
    return FAKE_LIBS
