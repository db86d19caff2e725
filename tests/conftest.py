"""Shared fixtures: an isolated state/cache dir for every test that touches the launcher."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIANCE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    """The model cache shared by tests (generated models are deterministic, so reuse is safe)."""
    path = Path(os.environ.get("RADIANCE_TEST_CACHE", REPO / ".cache" / "test-models"))
    path.mkdir(parents=True, exist_ok=True)
    return path
