"""`radiance up --runtime docker` end to end against a real Docker engine: the CLI contract

    radiance up PROFILE --runtime docker --detach [--image TAG] [--port N]
    radiance status [NAME] --json      -> {"name", "phase", "ready", "gateway_url", "runtime", ...}
    radiance down NAME

ready after the gate, a completion through the gateway on 127.0.0.1, and nothing left running."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from docker_helpers import free_port, http_json, wait_for
from launcher.runtime.docker import LABEL_DEPLOYMENT

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
PROFILE = "profiles/tiny-cpu.yaml"
NAME = "tiny-cpu"


def radiance(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_up_docker_ready_completion_down(docker_client, cpu_image, shared_cache, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIANCE_")}
    env.update(RADIANCE_HOME=str(tmp_path / "state"), RADIANCE_CACHE_DIR=str(shared_cache), NO_COLOR="1")

    def status() -> dict:
        proc = radiance(env, "status", NAME, "--json", timeout=60)
        return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}

    def engine_log() -> str:
        st = status()
        path = Path(st.get("engine_log") or "/nonexistent")
        return path.read_text()[-4000:] if path.exists() else ""

    up = radiance(env, "up", PROFILE, "--runtime", "docker", "--detach", "--image", cpu_image,
                  "--port", str(port), timeout=1500)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = wait_for(lambda: (s := status()) and s.get("ready") and s, 1200, "ready", interval=5,
                      on_fail=engine_log)
        assert st["runtime"] == "docker" and st["phase"] == "ready"
        assert st["gateway_url"] == f"http://127.0.0.1:{port}"
        engines = docker_client.containers.list(filters={"label": f"{LABEL_DEPLOYMENT}={NAME}"})
        assert len(engines) == 1
        bindings = engines[0].attrs["HostConfig"]["PortBindings"]
        assert all(b["HostIp"] == "127.0.0.1" for v in bindings.values() for b in v)
        status_code, body = http_json(st["gateway_url"] + "/v1/completions",
                                      {"model": "tiny", "prompt": "def fibonacci(n):", "max_tokens": 8})
        assert status_code == 200, body
        assert body["usage"]["completion_tokens"] > 0
    finally:
        down = radiance(env, "down", NAME, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_DEPLOYMENT}={NAME}"}) == []
    assert not _listening(port), "the gateway still listens after down"


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
