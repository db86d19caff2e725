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


# The session fixtures that bring up something costly, and the xdist group of every module that uses
# one (directly or through another fixture): the module runs in that group's worker, so it comes up once.
_SESSION_SERVICES = {"tiny": "tiny", "docker_client": "docker", "wheelhouse": "docker", "cpu_image": "docker"}
# The modules whose engines take both cores (TP = 2 ranks pinned to cores 0 and 1; the Ray module's three
# engines) share one group, so they come up one at a time. Side by side, in one CI rehearsal, test_tiny_tp2
# took 897 s and test_tiny_dflash_tp2 679 s to come up, and the Ray module's `up` took ~420 s; that run's
# pytest took 3332 s against 1936 s in the one before it.
_BOTH_CORES = "both-cores"
_BOTH_CORES_MODULES = {f"tests/e2e/{m}.py" for m in (
    "test_tiny_tp2", "test_tiny_dflash_tp2", "test_tiny_w4_tp2", "test_fp8_stream_tp2", "test_fp8_stream_block_tp2",
    "test_ray_serve")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` every module is one group (its module-scoped servers start once, in
    one worker); modules using one of ``_SESSION_SERVICES`` share that service's group. Runs before
    xdist reads the marks. The engine-starting tests (e2e, docker) go first: a worker takes groups in
    this order (`make test` passes --no-loadscope-reorder, or xdist would put the groups with most
    tests first, and the few-test modules that start servers would run last, one worker idle)."""
    slow = {"e2e", "docker"}
    items.sort(key=lambda it: not any(it.get_closest_marker(m) for m in slow))  # stable: order kept within
    groups: dict[str, str] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        service = next((g for f, g in _SESSION_SERVICES.items() if f in item.fixturenames), None)
        if service is not None:
            groups[module] = service
        else:
            groups.setdefault(module, _BOTH_CORES if module in _BOTH_CORES_MODULES else module)
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(groups[item.nodeid.split("::", 1)[0]]))


def _dispatch_exclusions() -> set[str]:
    import torch

    text = str(torch._C._dispatch_tls_local_exclude_set())  # "DispatchKeySet(A, B)"
    inner = text[text.index("(") + 1:text.rindex(")")]
    return {k.strip() for k in inner.split(",") if k.strip()}


_BASE_EXCLUSIONS: list[set[str]] = []


@pytest.fixture(autouse=True)
def _clean_dispatch_state(request):
    """Every test starts with the main thread's dispatch keys as the session found them. A torch guard
    that outlives its test leaves the Python key excluded, and every fake-tensor test after it fails
    ("you set no_dispatch()"): one CI run lost 27 tests so, none of them at fault; which test leaked the
    guard was not found. Reset it, and name the test that found it in the summary."""
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


@pytest.fixture(scope="module", autouse=True)
def _plugin_taken_back_after_the_module():
    """vLLM's in-process ``LLM`` (tests/e2e) loads the plugin into this process as well: its patches would
    stay on vLLM's classes for every later test of this worker, and a test installing a patch of its own
    would find the method replaced already. Taken back after each module."""
    yield
    plugin = sys.modules.get("radiance.plugin")
    if plugin is not None:
        plugin.unregister()
