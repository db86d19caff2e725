"""`radiance down [NAME]`: drain in-flight requests, stop the engine, leave nothing running."""
from __future__ import annotations

import os
import signal
import time

import click

from .. import console, errors
from ..runtime import runtime_class
from ..state import all_deployments, engine_stop_timeout
from ._common import pick_deployment


@click.command("down")
@click.argument("name", required=False)
@click.option("--all", "all_", is_flag=True, help="Stop every deployment.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait for the drain and the engine's exit before killing. "
                   "Default: what the deployment's own shutdown may take (its RADIANCE_DRAIN_TIMEOUT for the "
                   "requests in flight, as long again for the engine to exit) plus 60 s, at least 120 s.")
def command(name: str | None, all_: bool, timeout: float | None) -> None:
    """Stop deployment NAME (the only one, when NAME is omitted)."""
    targets = all_deployments() if all_ else [pick_deployment(name)]
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
        wait_s = shutdown_budget(st) if timeout is None else timeout
        deadline = time.monotonic() + wait_s
        with console.err.status(f"{st.name}: draining and stopping", spinner="dots"):
            while st.supervisor_alive() and time.monotonic() < deadline:
                time.sleep(0.3)
        if st.supervisor_alive():
            try:
                os.kill(st.supervisor_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _remove_leftovers(st)
            raise errors.LauncherError(f"{st.name}: did not stop within {wait_s:.0f}s; killed — fix: to let "
                                       f"long requests finish, raise --timeout")
        console.out.print(f"{st.name}: stopped")


def shutdown_budget(st) -> float:
    """How long the supervisor's own shutdown may take: the drain, then the engine's stop, plus room for
    the gateway and the state. Killing sooner would cut the very requests the drain is there to finish."""
    if st.drain_timeout_s is None:   # written by a launcher that did not record it
        return 120.0
    drain = st.drain_timeout_s
    return max(120.0, drain + engine_stop_timeout(drain) + 60.0)


def _remove_leftovers(st) -> int:
    """Stop an engine whose supervisor is gone; returns how many were stopped."""
    return runtime_class(st.runtime).leftovers(st)
