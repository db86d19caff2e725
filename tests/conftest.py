"""Shared fixtures: an isolated state/cache dir for every test that touches the launcher; and the
``gpu`` marker, which skips its tests by itself where there is no CUDA or ROCm GPU (select them
with ``-m gpu`` on a GPU machine)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_GPU: list[bool] = []


def _have_gpu() -> bool:
    if not _GPU:
        try:
            import torch

            _GPU.append(bool(torch.cuda.is_available()))
        except ImportError:
            _GPU.append(False)
    return _GPU[0]


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not _have_gpu():
        pytest.skip("needs a CUDA or ROCm GPU (marker gpu)")


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
