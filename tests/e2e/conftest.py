"""End-to-end fixtures: real `radiance up` of real vLLM on this CPU, one per configuration."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_e2e_secret_never_logged_4242"
SLOW_SAMPLER = Path(__file__).resolve().parent / "plant_slow_sampler"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def radiance(*args: str, env: dict, timeout: float = 1200, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"radiance {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class Deployment:
    name: str
    base: str
    env: dict
    up: subprocess.CompletedProcess
    ready_codes: list[int] = field(default_factory=list)

    def status(self) -> dict:
        out = radiance("status", self.name, "--json", env=self.env, check=True)
        return json.loads(out.stdout)

    def state(self) -> dict:
        home = Path(self.env["RADIANCE_HOME"])
        return json.loads((home / "deployments" / self.name / "state.json").read_text())

    def down(self) -> subprocess.CompletedProcess:
        return radiance("down", self.name, env=self.env, timeout=300)


def start(tmp_root: Path, profile: str, *, extra_env: dict | None = None, args: tuple[str, ...] = ()) -> Deployment:
    port = free_port()
    env = dict(os.environ)
    env.update({"RADIANCE_HOME": str(tmp_root / "state"), "PYTHONUNBUFFERED": "1"})
    env.setdefault("RADIANCE_CACHE_DIR", str(REPO / ".cache" / "radiance"))
    env.update(extra_env or {})
    base = f"http://127.0.0.1:{port}"
    codes: list[int] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            try:
                code = httpx.get(base + "/v1/health/ready", timeout=2).status_code
                if not codes or codes[-1] != code:
                    codes.append(code)
            except httpx.HTTPError:
                pass
            time.sleep(0.25)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    up = radiance("up", str(REPO / profile), "--detach", "--port", str(port), *args, env=env)
    time.sleep(0.5)
    done.set()
    t.join()
    name = profile_name(REPO / profile)
    return Deployment(name=name, base=base, env=env, up=up, ready_codes=codes)


def profile_name(path: Path) -> str:
    import yaml

    return yaml.safe_load(path.read_text())["name"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    # A secret in the environment: it must reach the engine and never a log, state file or report. The
    # slow-sampler plant sleeps in each engine step while the file E2E_SLOW_SAMPLER_FLAG names exists (only
    # test_gate_speed_e2e.py writes it): the speed check's slowdown on this engine, not on one more.
    root = tmp_path_factory.mktemp("tiny")
    plant = os.pathsep.join(filter(None, [str(SLOW_SAMPLER), os.environ.get("PYTHONPATH")]))
    dep = start(root, "profiles/tiny-cpu.yaml", extra_env={
        "HF_TOKEN": SECRET, "PYTHONPATH": plant, "E2E_SLOW_SAMPLER_FLAG": str(root / "slow_sampler_s")})
    if dep.up.returncode != 0:
        log = Path(dep.env["RADIANCE_HOME"]) / "deployments" / dep.name / "supervisor.log"
        dep.down()
        pytest.fail(f"radiance up failed ({dep.up.returncode}):\n{dep.up.stdout}\n{dep.up.stderr}\n"
                    f"{log.read_text() if log.exists() else ''}")
    yield dep
    dep.down()
