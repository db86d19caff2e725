"""Fixtures for tests against a real Docker engine (marker `docker`).

The engine is started when it is not running (tools/docker/start-dockerd.sh, as .ci/run does);
the CPU image is built from the debootstrap base image and the host wheelhouse, because no
registry is reachable here. Every step is idempotent and cached: a second session reuses the
base image, the wheels and the build cache.
"""
from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "docker"
BASE_IMAGE = "radiance-base:bookworm"


def _script(name: str, *args: str, timeout: float = 1800) -> None:
    proc = subprocess.run(["bash", str(TOOLS / name), *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="session")
def docker_client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=600)
        client.ping()
        return client
    except Exception:
        pass
    if os.geteuid() != 0:
        pytest.skip("no Docker engine reachable, and starting one needs root")
    _script("start-dockerd.sh", "--install", timeout=600)
    client = docker.from_env(timeout=600)
    client.ping()
    return client


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    path = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "radiance" / "wheelhouse"
    _script("wheelhouse.sh", str(path))
    return path


@pytest.fixture(scope="session")
def cpu_image(docker_client, wheelhouse) -> str:
    """The CPU image, built offline through `radiance build` (the docker SDK path, progress on stderr)."""
    import sys

    _script("make-base-image.sh", BASE_IMAGE)
    log = REPO / ".cache" / "docker-build-cpu.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "launcher", "build", "profiles/tiny-cpu.yaml",
                               "--wheelhouse", str(wheelhouse), "--base-image", BASE_IMAGE],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(f"radiance build failed ({proc.returncode}):\n{log.read_text()[-4000:]}")
    tag = proc.stdout.strip().splitlines()[-1]
    size = docker_client.images.get(tag).attrs["Size"]
    print(f"\n[docker] built {tag}: {size / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s (log {log})")
    return tag


@pytest.fixture(scope="session")
def tiny_model(shared_cache) -> Path:
    from tools import tinymodel

    return tinymodel.ensure(shared_cache)


@pytest.fixture(scope="session")
def rocm_layers_image(docker_client, cpu_image) -> str:
    """images/Dockerfile.rocm built on the CPU engine image instead of vLLM's ROCm image (no registry
    here, no ROCm to run): everything the file adds is built and run for real — radiance's wheel, the
    AOT step for gfx1201 (Triton compiles for a HIP target without the GPU), the entry point. Tagged
    apart, so the real ROCm tag never names it."""
    from rich.console import Console

    from launcher import images

    tag = "radiance-test:rocm-layers-on-cpu"
    log = REPO / ".cache" / "docker-build-rocm-on-cpu.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log.unlink(missing_ok=True)
    try:  # the build's own output goes to the log; the progress bars nowhere
        images.build("rocm", "gfx1201", tag=tag, base_image=cpu_image, client=docker_client,
                     console=Console(file=io.StringIO()), log_path=log)
    except images.ImageError as exc:
        pytest.fail(f"building Dockerfile.rocm on {cpu_image} failed: {exc}\n(log {log})")
    print(f"\n[docker] built {tag} on {cpu_image} in {time.monotonic() - t0:.0f} s (log {log})")
    return tag
