"""`radiance down` reads a pid from state.json: a zombie is gone, a recycled pid is not ours."""
import os
import subprocess
import sys
import time

from launcher import procs
from launcher.state import DeploymentState


def _state(pid: int, started: int | None) -> DeploymentState:
    return DeploymentState(name="t", profile_path="p", profile_hash="h", runtime="local",
                           gateway_url="http://127.0.0.1:1", engine_url="unix:/x", supervisor_pid=pid,
                           supervisor_started=started)


def test_a_running_process_is_alive_and_itself():
    me = os.getpid()
    assert procs.alive(me, procs.start_time(me))
    assert _state(me, procs.start_time(me)).supervisor_alive()


def test_a_recycled_pid_is_not_the_supervisor():
    me = os.getpid()
    assert not procs.alive(me, procs.start_time(me) - 1)
    assert not _state(me, procs.start_time(me) + 7).supervisor_alive()


def test_an_unreaped_child_counts_as_gone():
    """The case of a harness that started `radiance up` and has not waited on it yet."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = procs.start_time(child.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # exited, not reaped: a zombie
        fields = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            break
        time.sleep(0.05)
    try:
        os.kill(child.pid, 0)  # kill(0) alone still says "alive"
        assert not procs.alive(child.pid, started)
        assert not _state(child.pid, started).supervisor_alive()
    finally:
        child.wait()
    assert not procs.alive(child.pid)


def test_no_such_pid():
    assert not procs.alive(0)
    assert not procs.alive(2 ** 22 + 12345)


def test_group_members_sees_the_group_zombies_included():
    import signal

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert procs.group_members(child.pid) == {child.pid: procs.stat_fields(child.pid)[0]}
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(100):   # killed, not yet reaped: still a member, as a zombie
            if procs.group_members(child.pid).get(child.pid) == "Z":
                break
            time.sleep(0.02)
        assert procs.group_members(child.pid) == {child.pid: "Z"}
    finally:
        child.kill()
        child.wait()
    assert procs.group_members(child.pid) == {}
