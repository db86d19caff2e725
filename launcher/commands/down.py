"""`radiance down [NAME]`: drain in-flight requests, stop the engine, leave nothing running."""
from __future__ import annotations

import os
import signal
import time

import click

from .. import console, errors
from ..state import all_deployments
from .logs import _pick


@click.command("down")
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Stop every deployment.")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the drain and the engine's exit before killing.")
def command(name: str | None, all_: bool, timeout: float) -> None:
    """Stop deployment NAME (the only one, when NAME is omitted)."""
    targets = all_deployments() if all_ else [_pick(name)]
    for st in targets:
        if not st.supervisor_alive():
            # A supervisor that died (killed, machine crash) may have left its engine behind.
            left = _remove_leftovers(st)
            note = f"; removed {left} leftover engine(s)" if left else ""
            console.out.print(f"{st.name}: not running ({st.phase}){note}")
            continue
        try:
            os.kill(st.supervisor_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # it ended between the check and the signal
        deadline = time.monotonic() + timeout
        with console.err.status(f"{st.name}: draining and stopping", spinner="dots"):
            while st.supervisor_alive() and time.monotonic() < deadline:
                time.sleep(0.3)
        if st.supervisor_alive():
            try:
                os.kill(st.supervisor_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _remove_leftovers(st)
            raise errors.LauncherError(f"{st.name}: did not stop within {timeout:.0f}s; killed")
        console.out.print(f"{st.name}: stopped")


def _remove_leftovers(st) -> int:
    """Stop an engine whose supervisor is gone; returns how many were stopped."""
    if st.runtime == "docker":
        from ..runtime.docker import DockerRuntime

        try:
            return DockerRuntime().remove_leftovers(st.name)
        except Exception as exc:  # no engine reachable: nothing we can remove
            console.warn(f"{st.name}: could not look for leftover containers: {exc}")
            return 0
    if st.runtime == "ray" and st.ray_address:
        from ..runtime.ray_cluster import RayCluster

        try:  # Serve outlives a driver that was killed: its application (and each replica's engine) goes now
            cluster = RayCluster(st.name, st.ray_address)
            cluster.connect()
            before = cluster.replicas()["status"] != "NOT_FOUND"
            cluster.teardown()
            return int(before)
        except Exception as exc:  # a local cluster ended with its supervisor: nothing is left there
            console.warn(f"{st.name}: could not reach the Ray cluster at {st.ray_address}: {exc}")
            return 0
    if st.runtime == "local" and st.engine_ident.isdigit():
        pid = int(st.engine_ident)
        try:  # a recycled pid must not be killed: only a vLLM server started by us
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"vllm.entrypoints" not in f.read():
                    return 0
        except OSError:
            return 0
        try:
            os.killpg(pid, signal.SIGKILL)  # the engine runs in its own process group
            return 1
        except (ProcessLookupError, PermissionError):
            return 0
    return 0
