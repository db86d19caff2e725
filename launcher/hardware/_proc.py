"""Run probe commands in a subprocess with a timeout; never raise.

A vendor tool or a vendor library can hang on a wedged driver (amdsmi_init and nvmlInit both
block in the kernel), so neither runs in the launcher's own process. Tests swap the runner for
one that replays captured output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Failure = Literal["not_found", "timeout", "oserror"]


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when the command never ran to completion
    stdout: str = ""
    stderr: str = ""
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and self.returncode == 0

    def describe(self) -> str:
        cmd = self.argv[0] if self.argv else "?"
        if self.failure == "not_found":
            return f"{cmd}: not found"
        if self.failure == "timeout":
            return f"{cmd}: no answer within the timeout"
        if self.failure == "oserror":
            return f"{cmd}: {self.stderr.strip()}"
        tail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-1:] or [""]
        return f"{cmd} exited {self.returncode}: {tail[0][:200]}".rstrip(": ")


Runner = Callable[[Sequence[str], float], CommandResult]


def run_command(argv: Sequence[str], timeout: float) -> CommandResult:
    """The default runner: the real command, C locale so numbers and headers parse the same everywhere."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return CommandResult(tuple(argv), None, failure="not_found")
    except subprocess.TimeoutExpired:
        return CommandResult(tuple(argv), None, failure="timeout")
    except OSError as exc:
        return CommandResult(tuple(argv), None, stderr=str(exc), failure="oserror")
    return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def module_installed(name: str) -> bool:
    """Whether ``import name`` could work, without importing it (and without loading its C library)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def python_script(source: str) -> list[str]:
    """argv that runs ``source`` with this interpreter, so it sees the same site-packages."""
    return [sys.executable, "-c", source]


def run_library_probe(name: str, script: str, timeout: float, runner: "Runner", log) -> dict | None:
    """Run a vendor-library probe script in a child Python; its last stdout line is JSON.

    Returns the decoded object, or None after recording why in ``log`` (timeout, crash,
    unreadable output). An ``{"error": ...}`` object is returned as is: what it means is the
    vendor's to say.
    """
    res = runner(python_script(script), timeout)
    if not res.ok:
        log.record(name, "timeout" if res.failure == "timeout" else "failed", res.describe())
        return None
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        log.record(name, "failed", "unreadable output")
        return None
