"""`radiance up --runtime ray` as a user meets it before any cluster exists: its options, one-line errors
with exit code 2, the pieces it reads Serve's answers with, and the leash that takes an engine along
when its Ray replica is killed. The real cluster is tests/e2e/test_ray_serve.py."""
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import procs
from launcher.cli import cli
from launcher.gate import verdict
from launcher.profile import load_profile
from launcher.runtime import ray_cluster, ray_serve

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "profiles/tiny-cpu.yaml")


@pytest.fixture
def runner(isolated_home):
    return CliRunner()


def one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output, res.output
    return lines[0]


def up(runner, *args, env=None):
    return runner.invoke(cli, ["up", TINY, *args], catch_exceptions=False, env=env)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_bad_replicas_is_one_line_exit_2(runner, value):
    line = one_line_error(up(runner, "--runtime", "ray", "--replicas", value))
    assert f"--replicas {value!r}" in line and "fix:" in line


@pytest.mark.parametrize("args,flag", [
    (("--replicas", "2"), "--replicas"),
    (("--address", "127.0.0.1:6379"), "--address"),
    (("--runtime", "local", "--replicas", "2"), "--replicas"),
    (("--runtime", "docker", "--address", "127.0.0.1:6379"), "--address"),
])
def test_ray_options_need_runtime_ray(runner, args, flag):
    line = one_line_error(up(runner, *args))
    assert f"{flag} needs --runtime ray" in line and "fix:" in line


def test_ray_address_in_the_environment_is_no_error_for_other_runtimes(runner):
    # RAY_ADDRESS may be exported for other tools: only --address on the command line asks for Ray.
    line = one_line_error(up(runner, "--skip-gate", "--gate-only", env={"RAY_ADDRESS": "127.0.0.1:6379"}))
    assert "contradict" in line


@pytest.mark.parametrize("args,flag", [
    (("--skip-gate",), "--skip-gate"),
    (("--keep-serving-unready",), "--keep-serving-unready"),
    (("--image", "radiance:cpu"), "--image"),
])
def test_flags_that_do_not_apply_to_ray(runner, args, flag):
    line = one_line_error(up(runner, "--runtime", "ray", *args))
    assert f"{flag} does not apply to --runtime ray" in line


def test_empty_address_is_refused(runner):
    assert "--address is empty" in one_line_error(up(runner, "--runtime", "ray", "--address", " "))


def test_a_remote_cluster_needs_a_platform(runner, tmp_path):
    p = tmp_path / "auto.yaml"
    p.write_text(Path(TINY).read_text().replace("platform: cpu", "platform: auto"))
    res = runner.invoke(cli, ["up", str(p), "--runtime", "ray", "--address", "127.0.0.1:6379"],
                        catch_exceptions=False)
    assert "runtime.platform is auto" in one_line_error(res)


def test_without_ray_installed_the_fix_is_named(runner, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # what `import ray` meets where Ray is not installed
    line = one_line_error(up(runner, "--runtime", "ray"))
    assert "radiance[ray]" in line


def test_gate_failure_is_read_out_of_serves_message():
    message = ("A replica failed to start with exception. Retrying 8 more time(s). Error:\n"
               "ray::ServeReplica:tiny-ray:radiance.initialize_and_get_metadata() (pid=1, ip=127.0.0.1)\n"
               "  File \"...\", line 9, in __init__\n"
               "launcher.runtime.ray_serve.GateFailed: gate failed on replica ab12: acceptance 1.2 < 1.7\n")
    assert ray_cluster.gate_failure(message) == "gate failed on replica ab12: acceptance 1.2 < 1.7"
    assert ray_cluster.gate_failure("") is None
    assert ray_cluster.gate_failure("A replica failed to start: RuntimeError: engine exited") is None
    assert ray_cluster.ready_count({"states": {"RUNNING": 2, "STARTING": 1}}) == 2


def test_a_replica_reserves_the_profiles_devices():
    tiny = load_profile(TINY)
    assert ray_serve.actor_options(tiny, "cpu") == {"num_cpus": 1}
    tp2 = load_profile(REPO / "profiles/qwen3next-tp2.yaml")
    assert ray_serve.actor_options(tp2, "rocm") == {"num_cpus": 1, "num_gpus": 2}


def test_force_fail_knob_fails_the_gate_without_asking_the_engine(monkeypatch):
    monkeypatch.setenv("RADIANCE_GATE_FORCE_FAIL", "1")
    # Port 9 answers nothing: a gate that ran a check would raise EndpointUnreachable instead.
    out = asyncio.run(verdict.run(load_profile(TINY), "http://127.0.0.1:9", context={}))
    assert not out.passed and "RADIANCE_GATE_FORCE_FAIL" in out.reason and out.summary["checks"] == []


def test_leash_kills_the_group_once_its_owner_is_killed(tmp_path):
    """A stand-in for a Ray replica: it starts a process group (a shell and its child, as vLLM's API server
    and engine core), leashes it, and is SIGKILLed; the group must not outlive it."""
    code = ("import subprocess, sys, time; sys.path.insert(0, %r); from launcher import procs; "
            "p = subprocess.Popen(['sh', '-c', 'sleep 300 & sleep 300; wait'], start_new_session=True); "
            "procs.leash(p.pid); print(p.pid, flush=True); time.sleep(300)" % str(REPO))
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pgid = int(owner.stdout.readline())
    assert procs.group_members(pgid)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 10
    while procs.group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {pid: st for pid, st in procs.group_members(pgid).items() if st not in "ZX"}
    if left:
        os.killpg(pgid, signal.SIGKILL)
    assert not left


def _ray_profile(tmp_path, extra: str) -> Path:
    p = tmp_path / "ray.yaml"
    p.write_text(Path(TINY).read_text().replace("  kind: local\n", "  kind: ray\n" + extra))
    return p


def test_the_profile_says_ray_and_its_replicas_and_the_flags_override(tmp_path, monkeypatch):
    from launcher.commands.up import _runtime

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    profile = load_profile(_ray_profile(tmp_path, "  replicas: 3\n  address: head:6379\n"))
    none = {"--replicas": None, "--address": None, "--image": None, "--skip-gate": None,
            "--keep-serving-unready": None}
    rt = _runtime(profile.runtime.kind, profile, none)
    assert (rt.kind, rt.replicas, rt.address) == ("ray", 3, "head:6379")
    assert rt.argv() == ("--replicas", "3", "--address", "head:6379") and rt.elsewhere()
    rt = _runtime("ray", profile, {**none, "--replicas": "2", "--address": "other:6379"})
    assert (rt.replicas, rt.address) == (2, "other:6379")
    monkeypatch.setenv("RAY_ADDRESS", "env:6379")       # below the profile's address, above a local cluster
    assert _runtime("ray", profile, none).address == "head:6379"
    assert _runtime("ray", load_profile(_ray_profile(tmp_path, "")), none).address == "env:6379"
    assert _runtime("local", profile, none).kind == "local"     # --runtime local: the ray fields do not apply


def test_a_remote_cluster_in_the_profile_needs_a_platform(runner, tmp_path):
    p = _ray_profile(tmp_path, "  address: head:6379\n")
    p.write_text(p.read_text().replace("platform: cpu", "platform: auto"))
    assert "runtime.platform is auto" in one_line_error(runner.invoke(cli, ["up", str(p)], catch_exceptions=False))


@pytest.mark.parametrize("extra,field", [("  replicas: 2\n", "runtime.replicas"),
                                         ("  address: head:6379\n", "runtime.address")])
def test_ray_fields_need_kind_ray_in_the_profile(runner, tmp_path, extra, field):
    p = tmp_path / "local.yaml"
    p.write_text(Path(TINY).read_text().replace("  kind: local\n", "  kind: local\n" + extra))
    line = one_line_error(runner.invoke(cli, ["up", str(p)], catch_exceptions=False))
    assert line.startswith(f"error: {p}:") and f"{field}: is for runtime.kind ray" in line and "fix:" in line


def test_zero_replicas_in_the_profile_is_a_profile_error(runner, tmp_path):
    p = _ray_profile(tmp_path, "  replicas: 0\n")
    line = one_line_error(runner.invoke(cli, ["up", str(p)], catch_exceptions=False))
    assert "runtime.replicas: must be >= 1" in line
