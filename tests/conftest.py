"""Shared fixtures: an isolated state/cache dir for every test that touches the launcher; the
``gpu`` marker, which skips its tests by itself where there is no CUDA or ROCm GPU (select them
with ``-m gpu`` on a GPU machine); the groups `make test` runs side by side (pytest-xdist); and a
clean torch dispatch state at the start of every test."""
from __future__ import annotations

import os
import sys
import warnings
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


# Tests that share a session fixture run in one xdist worker, so it is brought up once: the Docker
# engine and CPU image (everything under tests/docker), the shared tiny deployment (`tiny`).
_SHARED_GROUPS = {"tests/docker/": "docker", "tests/e2e/test_spine.py": "tiny", "tests/e2e/test_gate_e2e.py": "tiny"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` every module is one group (its module-scoped servers start once, in
    one worker); modules sharing a session fixture share a group. Runs before xdist reads the marks.
    The engine-starting tests (e2e, docker) go first: a worker takes groups in this order (`make test`
    passes --no-loadscope-reorder, or xdist would put the groups with most tests first, and the few-test
    modules that start servers would run last, one worker idle)."""
    slow = {"e2e", "docker"}
    items.sort(key=lambda it: not any(it.get_closest_marker(m) for m in slow))  # stable: order kept within
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.nodeid.split("::", 1)[0]
        group = next((g for prefix, g in _SHARED_GROUPS.items() if path.startswith(prefix)), path)
        item.add_marker(pytest.mark.xdist_group(group))


def _dispatch_exclusions() -> set[str]:
    import torch

    text = str(torch._C._dispatch_tls_local_exclude_set())  # "DispatchKeySet(A, B)"
    inner = text[text.index("(") + 1:text.rindex(")")]
    return {k.strip() for k in inner.split(",") if k.strip()}


_BASE_EXCLUSIONS: list[set[str]] = []


@pytest.fixture(autouse=True)
def _clean_dispatch_state(request):
    """Every test starts with the main thread's dispatch keys as the session found them. A torch guard
    that outlives its test (a suspended no_dispatch() collected later) leaves the Python key excluded,
    and every fake-tensor test after it fails ("you set no_dispatch()"): one CI run lost 27 tests so,
    none of them at fault. Reset it, and say so in the summary."""
    if "torch" in sys.modules:
        import torch

        now = _dispatch_exclusions()
        if not _BASE_EXCLUSIONS:
            _BASE_EXCLUSIONS.append(now)
        extra = now - _BASE_EXCLUSIONS[0]
        if extra:
            for name in extra:
                torch._C._dispatch_tls_set_dispatch_key_excluded(getattr(torch._C.DispatchKey, name), False)
            warnings.warn(f"dispatch keys {sorted(extra)} were left excluded before {request.node.nodeid}; "
                          "reset", RuntimeWarning, stacklevel=1)
    yield


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
