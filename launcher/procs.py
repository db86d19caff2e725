"""Is a pid from state.json still the process we started? (Linux /proc; elsewhere: kill(0) only.) And the
process-tree care every engine starter shares (``become_subreaper``, ``leash``).

A pid outlives its process in two ways that matter to `radiance down`: as a zombie its parent has
not reaped yet (a Python harness that started `radiance up` and is waiting on something else), and
as a number the kernel hands to a new process. A zombie is gone; a recycled pid is not ours. The
process's start time (field 22 of /proc/PID/stat, in clock ticks since boot) tells both apart.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on (state, ppid, pgrp, ...), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    return raw[raw.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    fields = stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid: int, started: int | None = None) -> bool:
    """True while ``pid`` runs (not a zombie) and, when ``started`` is known, is the same process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = stat_fields(pid)
    if fields is None:
        return not os.path.isdir("/proc/self")  # no /proc here: kill(0) is all we know
    if fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


def group_members(pgid: int) -> dict[int, str]:
    """{pid: state letter} of the processes in process group ``pgid``, zombies included ({} without /proc)."""
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit() and (fields := stat_fields(int(entry))) and int(fields[2]) == pgid:
            out[int(entry)] = fields[0]
    return out


def named_members(pgid: int, prefix: str) -> dict[int, int]:
    """{pid: start time} of the live processes in group ``pgid`` whose name (/proc/PID/comm) starts with
    ``prefix``: vLLM names its engine core and workers ``VLLM::...``."""
    out = {}
    for pid, state in group_members(pgid).items():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if state not in ("Z", "X") and name.startswith(prefix) and (t := start_time(pid)) is not None:
            out[pid] = t
    return out


def leash(pgid: int, env: dict[str, str] | None = None) -> None:
    """Have process group ``pgid`` killed as soon as this process ends, however it ends (a Ray replica
    is SIGKILLed when Serve gives up on it: only its direct children go with it, and vLLM's engine core
    outlives a killed API server). The watcher is forked off a short-lived child, so it is nobody's child
    and no reaper of ours takes it along; it leaves by itself once the group has ended."""
    me = os.getpid()
    first = subprocess.Popen([sys.executable, "-m", "launcher.procs", str(me), str(start_time(me) or 0), str(pgid)],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    first.wait()


def _watch(pid: int, started: int, pgid: int) -> None:
    if os.fork():
        os._exit(0)
    while alive(pid, started or None):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def become_subreaper() -> None:
    """Linux: orphans of the engine (a worker whose parent, the engine core, went first) become our
    children instead of init's, so their starter (LocalEngine.stop, `radiance bench`) reaps them and none
    lingers as a zombie where init does not reap (containers without an init, sandboxes)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    _watch(*(int(a) for a in sys.argv[1:4]))

