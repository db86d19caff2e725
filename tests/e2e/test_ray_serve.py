"""`radiance up --runtime ray`, for real: a Ray cluster of three nodes on this host (`ray start`, one CPU
each, so each node holds one replica), the trained tiny Qwen3.5 on vLLM CPU, three replicas. Two gate
and share the traffic; the third node runs with RADIANCE_GATE_FORCE_FAIL=1 in the environment of its
`ray start`, so its replica fails its gate (Serve retries it there) and never answers a request. Killing
one serving replica's engine mid-run loses no request that had not started streaming, and the other
replica keeps serving. `radiance down` leaves no Ray actor (Ray's state API) and no engine process.

One cluster and one deployment for the module; the tests read it in file order and the last takes it down.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from .conftest import REPO, free_port, radiance

pytestmark = pytest.mark.e2e

NAME = "tiny-ray"
REPLICAS = 3
FAIL_RESOURCE = "radiance_gate_fails_here"   # marks the node whose gates fail, for the test to find it
# Ray's CLI beside this Python (a pyenv shim for it exists only after a rehash).
RAY = str(Path(sys.executable).with_name("ray"))


def _ray(*args: str, env: dict) -> None:
    proc = subprocess.run([RAY, *args], env=env, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise AssertionError(f"ray {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")


def _engines(home: str) -> list[str]:
    """The vLLM processes (API servers, engine cores, workers) this module's Ray nodes started on this host,
    as 'pid cmdline': they carry the nodes' environment (``RADIANCE_HOME=home``). A ``RAY_`` variable alone
    does not tell: ``import ray`` sets RAY_CLIENT_MODE in the importing process, so every engine a test
    session starts after that (the session's shared tiny deployment) carries it too."""
    mark = f"RADIANCE_HOME={home}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not ("vllm.entrypoints" in cmd or cmd.startswith("VLLM::")):
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            out.append(f"{entry} {cmd[:120]}")
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    env = dict(os.environ, RADIANCE_HOME=str(tmp / "state"), PYTHONUNBUFFERED="1")
    env.setdefault("RADIANCE_CACHE_DIR", str(REPO / ".cache" / "radiance"))
    port, dash = free_port(), free_port()
    address = f"127.0.0.1:{port}"

    def small() -> list[str]:
        # Three nodes on one host: each its own agent ports (the defaults would collide, and a node whose
        # dashboard agent did not start has no logs for the state API).
        return ["--num-cpus", "1", "--object-store-memory", str(150 * 1024 * 1024), "--disable-usage-stats",
                "--node-ip-address", "127.0.0.1", "--dashboard-agent-listen-port", str(free_port()),
                "--dashboard-agent-grpc-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
                "--metrics-export-port", str(free_port())]

    try:
        _ray("start", "--head", "--port", str(port), "--dashboard-port", str(dash), *small(), env=env)
        _ray("start", "--address", address, *small(), env=env)
        _ray("start", "--address", address, *small(), "--resources", json.dumps({FAIL_RESOURCE: 1}),
             env=dict(env, RADIANCE_GATE_FORCE_FAIL="1"))
        yield {"address": address, "env": env, "tmp": tmp}
    finally:
        _stop_own_nodes(env["RADIANCE_HOME"])


def _own_processes(home: str) -> list[int]:
    """Every process this module's nodes started (they carry ``RADIANCE_HOME=home``), none other: `ray stop
    --force` would stop every Ray process on the host, a user's own cluster too."""
    mark = f"RADIANCE_HOME={home}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    out.append(int(entry))
            except OSError:
                continue
    return out


def _stop_own_nodes(home: str, grace: float = 20.0) -> None:
    import signal
    import time

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in _own_processes(home):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while _own_processes(home) and time.monotonic() < deadline:
            time.sleep(0.5)


def _state_api(address: str, what: str) -> list[dict]:
    """Ray's state API, asked from a process of its own (a driver here would own actors of its own)."""
    code = ("import dataclasses, json, ray; from ray.util import state; "
            f"ray.init(address={address!r}, logging_level='ERROR'); "
            f"print(json.dumps([dataclasses.asdict(r) for r in state.list_{what}(limit=10000)], default=str))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dep(cluster):
    data = yaml.safe_load((REPO / "profiles/tiny-cpu.yaml").read_text())
    data["name"] = NAME
    # Two cores for three engines: no thread pinning (every engine would pin the same cores), one thread each.
    data["env"].update({"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"})
    # What this module tests is how Serve admits, routes and replaces gated replicas; the target check
    # (tests/e2e/test_gate_e2e.py) would add its 16 greedy prompts to each replica's gate, 45-70 s with
    # three engines on two cores.
    data["gate"]["target"]["enabled"] = False
    profile = cluster["tmp"] / f"{NAME}.yaml"
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    env = cluster["env"]
    port = free_port()
    t0 = time.monotonic()
    up = radiance("up", str(profile), "--runtime", "ray", "--replicas", str(REPLICAS), "--address",
                  cluster["address"], "--port", str(port), "--detach", env=env, timeout=900)
    base = f"http://127.0.0.1:{port}"
    d = {"base": base, "env": env, "up": up, "address": cluster["address"]}
    if up.returncode != 0:
        radiance("down", NAME, env=env, timeout=300)
        pytest.fail(f"radiance up exited {up.returncode}:\n{up.stdout}\n{up.stderr}")
    # `up` returns once one replica serves and another has failed its gate; the second may still be gating.
    # Its time counts from there: in a full suite beside the other worker's tests, `up` itself took ~420 s
    # (three engines on two cores), and a deadline counted from before `up` had run out when it returned.
    t_up = time.monotonic()
    while _status(d).get("replicas", {"states": {}})["states"].get("RUNNING", 0) < REPLICAS - 1:
        assert time.monotonic() - t_up < 600, _status(d)
        time.sleep(2)
    print(f"\n[ray] up, {REPLICAS - 1}/{REPLICAS} replicas serving after {time.monotonic() - t0:.0f}s")
    yield d
    radiance("down", NAME, env=env, timeout=300)   # a no-op once the last test took it down


def _status(dep) -> dict:
    """`radiance status --json` once the gateway's own view came with it: on two cores busy with three
    engines, one status call may miss the gateway (it says so in `live`); a minute of misses fails."""
    t0 = time.monotonic()
    while True:
        st = json.loads(radiance("status", NAME, "--json", env=dep["env"], check=True).stdout)
        if "live" not in st or time.monotonic() - t0 > 60:
            return st
        time.sleep(2)


def _live(dep) -> dict:
    return httpx.get(dep["base"] + "/radiance/status", timeout=10).json()


def _complete(base: str, i: int, max_tokens: int = 8) -> tuple[int, str | None]:
    r = httpx.post(base + "/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": f"def f{i}(x):", "max_tokens": max_tokens, "temperature": 0})
    return r.status_code, r.headers.get("X-Radiance-Replica")


def test_two_replicas_gate_and_share_the_traffic_the_failing_one_gets_none(dep):
    st = _status(dep)
    assert st["runtime"] == "ray" and st["ready"], st
    assert "RADIANCE_GATE_FORCE_FAIL" in (st["replicas"]["gate_failure"] or ""), st["replicas"]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: _complete(dep["base"], i), range(24)))
    assert all(code == 200 for code, _ in answers), answers
    counts: dict[str, int] = {}
    for _, replica in answers:
        counts[replica] = counts.get(replica, 0) + 1
    print(f"\n[ray] 24 requests, per replica (X-Radiance-Replica): {counts}")
    assert len(counts) == 2 and min(counts.values()) >= 3, counts

    # What the replicas say of themselves: node, and how many requests each has served.
    seen = _live(dep)["replicas"]["answered_by"]
    assert set(seen) == set(counts), seen
    nodes = {row["node_id"]: row for row in _state_api(dep["address"], "nodes")}
    fail_node = next(n for n, row in nodes.items() if FAIL_RESOURCE in (row.get("resources_total") or {}))
    assert len({seen[r]["node"] for r in seen}) == 2 and fail_node not in {seen[r]["node"] for r in seen}, seen
    # The failing node did get a replica (more than one: Serve keeps retrying it there) ...
    actors = [a for a in _state_api(dep["address"], "actors") if a["class_name"] == f"ServeReplica:{NAME}:radiance"]
    assert any(a["node_id"] == fail_node for a in actors), actors
    print(f"[ray] replica actors per node: "
          f"{ {n[:8]: sum(a['node_id'] == n for a in actors) for n in nodes} } (failing node {fail_node[:8]})")

    # ... whose gate failed, and the two others' passed: their logs, through `radiance logs`.
    logs = radiance("logs", NAME, env=dep["env"], check=True).stdout
    assert logs.count("gate passed") >= 2 and "gate FAILED" in logs, logs[-3000:]


def _stream(base: str, i: int, out: dict) -> None:
    body = {"model": "tiny", "prompt": f"def g{i}(x):", "max_tokens": 48, "temperature": 0, "ignore_eos": True,
            "stream": True}
    rec = {"sent": time.monotonic(), "first": None, "done": False, "status": None, "replica": None}
    try:
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=180) as r:
            rec["status"], rec["replica"] = r.status_code, r.headers.get("X-Radiance-Replica")
            for line in r.iter_lines():
                if line.startswith("data: ") and rec["first"] is None:
                    rec["first"] = time.monotonic()
                if line == "data: [DONE]":
                    rec["done"] = True
    except httpx.HTTPError as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    out[i] = rec


def test_killing_one_engine_mid_run_loses_no_request_that_had_not_started(dep):
    seen = _live(dep)["replicas"]["answered_by"]
    victim, survivor = sorted(seen)
    engine_pid = seen[victim]["engine_pid"]
    out: dict[int, dict] = {}
    kill_at: list[float] = []
    threads = []
    for i in range(36):   # 4 in flight at a time for ~the first third, the engine killed among them
        t = threading.Thread(target=_stream, args=(dep["base"], i, out))
        t.start()
        threads.append(t)
        if i == 8:
            os.killpg(engine_pid, signal.SIGKILL)   # the engine's whole process group (its own session)
            kill_at.append(time.monotonic())
        time.sleep(0.4)
        while sum(t.is_alive() for t in threads) >= 4:
            time.sleep(0.05)
    for t in threads:
        t.join(timeout=240)
    killed = kill_at[0]
    lost = {i: r for i, r in out.items() if not (r["status"] == 200 and r["done"])}
    # A request may be cut only if its stream had begun on the victim before the kill: what a client read
    # from the victim its engine wrote (the gateway adds nothing mid-stream), and a killed engine writes
    # nothing. The client's clock cannot tell: on two busy cores a first line the engine wrote before the
    # kill reached the client 2 s after it (a run of this module on this 2-core machine).
    unstarted_lost = {i: r for i, r in lost.items() if r["first"] is None or r["replica"] != victim}
    # A request sent after the kill cannot have reached the victim's engine: whatever Serve still routed to
    # the victim went again, to a replica with an engine.
    after = {i: r for i, r in out.items() if r["sent"] > killed}
    print(f"\n[ray] 36 streams, engine of replica {victim} killed after #8: {len(lost)} cut mid-stream "
          f"(started on it before the kill), {len(out) - len(lost)} whole; after the kill answered by "
          f"{sorted({r['replica'] for r in after.values() if r['replica']})}")
    assert len(out) == 36 and not unstarted_lost, unstarted_lost
    assert after and all(r["done"] and r["replica"] != victim for r in after.values()), after
    assert any(r["replica"] == survivor for r in after.values()), after
    # The other replica keeps serving.
    assert _complete(dep["base"], 999)[0] == 200


def test_down_leaves_no_ray_actor_and_no_engine(dep):
    st = _status(dep)
    assert st["ready"], st
    home = dep["env"]["RADIANCE_HOME"]
    assert _engines(home), "the probe finds none of the serving replica's engine processes"
    t0 = time.monotonic()
    down = radiance("down", NAME, env=dep["env"], timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    took = time.monotonic() - t0
    deadline = time.monotonic() + 30
    while (left := _engines(home)) and time.monotonic() < deadline:
        time.sleep(0.5)
    alive = [a for a in _state_api(dep["address"], "actors") if a["state"] == "ALIVE"]
    print(f"\n[ray] down in {took:.1f}s; alive actors after: {alive}; engine processes: {left}")
    assert not alive and not left
    assert _status(dep)["phase"] == "stopped"
