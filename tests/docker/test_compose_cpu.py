"""`docker compose up` for the CPU variant on a real engine: the engine becomes healthy, the gateway
runs the gate and only then turns ready, a completion goes through 127.0.0.1, `down` removes all."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from docker_helpers import free_port, http_json, wait_for

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


def compose_cli() -> list[str]:
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode == 0:
        return ["docker", "compose"]
    probe = subprocess.run(["docker-compose", "version"], capture_output=True, text=True)
    if probe.returncode == 0:
        return ["docker-compose"]
    pytest.skip("neither the compose plugin nor docker-compose is installed (apt-get install docker-compose)")


def test_compose_cpu_stack(docker_client, cpu_image):
    cli = compose_cli()
    port = free_port()
    project = f"radiance-test-{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RADIANCE_", "COMPOSE_"))}
    env.update(RADIANCE_PLATFORM="cpu", RADIANCE_IMAGE=cpu_image, RADIANCE_PORT=str(port),
               RADIANCE_PROFILE="profiles/tiny-cpu.yaml")
    base = [*cli, "-p", project, "-f", str(REPO / "compose.yaml")]

    def run(*args, timeout=600, check=True):
        proc = subprocess.run([*base, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            pytest.fail(f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def logs() -> str:
        return run("logs", "--no-color", "--tail", "60", check=False).stdout

    try:
        # --no-build: the image the launcher built (offline) is the one to run.
        run("up", "-d", "--no-build")
        url = f"http://127.0.0.1:{port}"
        # The gateway answers live at once but is not ready until the engine is healthy and the gate passed.
        wait_for(lambda: http_json(url + "/v1/health/live", timeout=5)[0] == 200, 900, "the gateway to listen",
                 on_fail=logs)
        wait_for(lambda: http_json(url + "/v1/health/ready", timeout=5)[0] == 200, 1200, "the gate to pass",
                 interval=5, on_fail=logs)
        status, body = http_json(url + "/v1/completions",
                                 {"model": "tiny", "prompt": "def fibonacci(n):", "max_tokens": 8})
        assert status == 200, body
        assert body["usage"]["completion_tokens"] > 0
        ps = run("ps").stdout
        assert "healthy" in ps or "Up" in ps
    finally:
        run("down", "-v", "--timeout", "60", timeout=300, check=False)
    left = docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
    assert left == []
