"""`docker compose up` for the CPU variant on a real engine: the engine becomes healthy, the gateway
runs the gate and only then turns ready, a completion goes through 127.0.0.1, the engine's own report
(patch rows, radiance:* counters) reaches the gateway's /metrics and /radiance/status, the engine
answers nothing over TCP, and `down` removes all.

The image is images/Dockerfile.rocm built on the CPU engine image (`rocm_layers_image`): the one
bring-up serves both, so the ROCm file's layers (radiance's wheel, the gfx1201 AOT step, radiance-engine
as compose's entry point) are run for real, and the CPU image below them is what runs vLLM. The CPU
image alone still serves in test_cpu_image.py and test_up_docker.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import netprobe
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


def test_compose_cpu_stack(docker_client, rocm_layers_image):
    cli = compose_cli()
    port = free_port()
    project = f"radiance-test-{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RADIANCE_", "COMPOSE_"))}
    env.update(RADIANCE_PLATFORM="cpu", RADIANCE_IMAGE=rocm_layers_image, RADIANCE_PORT=str(port),
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
        _assert_report_reaches_the_gateway(url)
        _assert_engine_answers_nothing_over_tcp(docker_client, project)
    finally:
        run("down", "-v", "--timeout", "60", timeout=300, check=False)
    left = docker_client.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
    assert left == []


def _assert_report_reaches_the_gateway(url: str) -> None:
    """What the plugin did inside the engine container, through vLLM's own stats and /metrics, seen by the
    gateway container (they share no file)."""
    import urllib.request

    metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    steps = [ln for ln in metrics.splitlines() if ln.startswith("radiance:draft_steps_total")]
    assert steps and float(steps[0].split()[-1]) > 0, steps  # the gate's traffic went through the depth policy
    assert "radiance:patch_status{" in metrics
    code, st = http_json(url + "/radiance/status")
    assert code == 200, st
    rows = {p["feature"]: p["status"] for p in st["patches"]}
    assert rows == {"dynamic_draft": "applied", "w4_drafter": "applied", "int4_head": "applied",
                    "fp8_stream": "disabled"}, st["patches"]
    assert st["telemetry"].get("draft_steps", 0) > 0, st["telemetry"]
    print(f"\n[compose] patches {rows}; telemetry {st['telemetry']}")


def _assert_engine_answers_nothing_over_tcp(docker_client, project: str) -> None:
    (engine,) = docker_client.containers.list(filters={"label": [f"com.docker.compose.project={project}",
                                                                 "com.docker.compose.service=engine"]})
    assert not engine.attrs["HostConfig"].get("PortBindings")
    ip = next(n["IPAddress"] for n in engine.attrs["NetworkSettings"]["Networks"].values() if n["IPAddress"])
    inside = sorted(set(netprobe.listening(engine.attrs["State"]["Pid"]).values()))
    answers = netprobe.probe_all([(ip, p) for h, p in inside if not h.startswith("127.")])
    assert not any(netprobe.answered_ok(line) for line in answers.values()), answers
    assert answers == {}, answers   # vLLM's internal sockets on the container's loopback (VLLM_HOST_IP)
