"""`radiance up --runtime docker` end to end against a real Docker engine: the CLI contract

    radiance up PROFILE --runtime docker --detach [--image TAG] [--port N]
    radiance status [NAME] --json      -> {"name", "phase", "ready", "gateway_url", "runtime", ...}
    radiance down NAME

ready after the gate, a completion through the gateway on 127.0.0.1, and nothing left running. The
deployment has an API key, and while it is up nothing but the gateway answers /v1 without it: the
engine container publishes no port and serves on a socket in the launcher's private directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import netprobe
from docker_helpers import free_port, http_json, wait_for
from launcher.runtime.docker import LABEL_DEPLOYMENT

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
NAME = "tiny-keyed-docker"
KEY = "gateway-key-docker-31b7"


def radiance(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_up_docker_ready_completion_down(docker_client, cpu_image, shared_cache, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIANCE_")}
    env.update(RADIANCE_HOME=str(tmp_path / "state"), RADIANCE_CACHE_DIR=str(shared_cache), NO_COLOR="1",
               RADIANCE_API_KEY=KEY)
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["name"] = NAME
    data["server"]["api_key_env"] = "RADIANCE_API_KEY"
    profile = tmp_path / f"{NAME}.yaml"
    profile.write_text(yaml.safe_dump(data, sort_keys=False))

    def status() -> dict:
        proc = radiance(env, "status", NAME, "--json", timeout=60)
        return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else {}

    def engine_log() -> str:
        st = status()
        path = Path(st.get("engine_log") or "/nonexistent")
        return path.read_text()[-4000:] if path.exists() else ""

    up = radiance(env, "up", str(profile), "--runtime", "docker", "--detach", "--image", cpu_image,
                  "--port", str(port), timeout=1500)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = wait_for(lambda: (s := status()) and s.get("ready") and s, 1200, "ready", interval=5,
                      on_fail=engine_log)
        assert st["runtime"] == "docker" and st["phase"] == "ready"
        assert st["gateway_url"] == f"http://127.0.0.1:{port}"
        engines = docker_client.containers.list(filters={"label": f"{LABEL_DEPLOYMENT}={NAME}"})
        assert len(engines) == 1
        _assert_no_bypass(engines[0], port, tmp_path)
        status_code, body = http_json(st["gateway_url"] + "/v1/completions",
                                      {"model": "tiny", "prompt": "def fibonacci(n):", "max_tokens": 8},
                                      headers={"Authorization": f"Bearer {KEY}"})
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


def _assert_no_bypass(container, gateway_port: int, tmp_path: Path) -> None:
    """Every listener of the deployment, on the host (the supervisor and its gateway) and in the
    engine container's network namespace (reachable from the host at the container's address),
    refuses /v1/models without credentials; only the gateway answers, with 401."""
    state = json.loads((tmp_path / "state" / "deployments" / NAME / "state.json").read_text())
    host_ports = netprobe.ports_of(netprobe.process_tree(state["supervisor_pid"]))
    assert [p for _, p in host_ports] == [gateway_port], host_ports
    assert netprobe.get_v1_models("127.0.0.1", gateway_port).split()[1] == "401"
    container.reload()
    assert not container.attrs["HostConfig"].get("PortBindings")      # nothing published
    ip = next(n["IPAddress"] for n in container.attrs["NetworkSettings"]["Networks"].values() if n["IPAddress"])
    inside = netprobe.listening(container.attrs["State"]["Pid"])
    answers = {}
    for host, port in sorted(set(inside.values())):
        if host.startswith("127.") or host == "::1":
            continue  # the container's own loopback: not reachable from outside it
        answers[f"{ip}:{port}"] = netprobe.get_v1_models(ip, port, timeout=2)
    print(f"\n[bypass] host listeners {host_ports}; container listeners {sorted(set(inside.values()))}; "
          f"probed from the host: {answers}")
    assert not any(netprobe.answered_ok(line) for line in answers.values()), answers
    # vLLM's own sockets (engine-core ZMQ, torch.distributed) stay on the container's loopback too
    # (VLLM_HOST_IP): nothing of the engine is reachable from the host but through the socket.
    assert answers == {}, answers
    assert state["engine_url"].startswith("unix:")
