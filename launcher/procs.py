"""Is a pid from state.json still the process we started? (Linux /proc; elsewhere: kill(0) only.)

A pid outlives its process in two ways that matter to `radiance down`: as a zombie its parent has
not reaped yet (a Python harness that started `radiance up` and is waiting on something else), and
as a number the kernel hands to a new process. A zombie is gone; a recycled pid is not ours. The
process's start time (field 22 of /proc/PID/stat, in clock ticks since boot) tells both apart.
"""
from __future__ import annotations

import os


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
