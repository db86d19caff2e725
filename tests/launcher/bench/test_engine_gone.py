"""A kept engine (`radiance bench --keep-reference`) whose engine process dies while the bench waits on its
worker: the nineteenth session's engine core was killed by the host's OOM killer in the middle of a sleep, its
worker waited on for good, and the bench with it. Real processes here; the worker and its engine core are
stand-ins (a vLLM engine core cannot be OOM-killed on cue), named as vLLM names its engine processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher import procs
from launcher.bench import run

# a worker that answers nothing, with a child named like vLLM's engine core
_WORKER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "open('/proc/self/comm', 'w').write('VLLM::EngineCor'); "
                  "import time; time.sleep(120)"])
time.sleep(120)
"""


def _kept(tmp_path: Path, proc: subprocess.Popen) -> run.Resident:
    r = object.__new__(run.Resident)   # the fields _await reads, without starting vLLM
    r.proc, r.out, r.error = proc, tmp_path / "result.json", None
    r.opts = run.Options(batches=[1], max_tokens=2, timeout_s=600.0)
    r._engine_procs = None
    return r


def test_an_engine_process_that_dies_ends_the_wait_with_a_stand_in_worker(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WORKER], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (engines := procs.named_members(proc.pid, run.ENGINE_PROCESS_PREFIX)):
            assert time.monotonic() < deadline, "the stand-in engine process never came up"
            time.sleep(0.1)
        r = _kept(tmp_path, proc)
        r._engine_procs = engines
        assert r._engine_gone() is None
        os.kill(next(iter(engines)), signal.SIGKILL)
        t0 = time.monotonic()
        assert r._await(tmp_path / "result.json.1", "sleep (1)", 300.0) is False
        assert time.monotonic() - t0 < 10   # not the turn's 300 s
        assert "exited while the bench waited for sleep (1)" in r.error
        assert proc.poll() is None          # the worker itself still runs: only its engine died
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_wait_with_no_engine_process_known_times_out_with_a_stand_in_worker(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        r = _kept(tmp_path, proc)
        assert r._await(tmp_path / "never", "wake (2)", 0.5) is False
        assert "no wake (2) after" in r.error
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
