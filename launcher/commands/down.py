"""`radiance down [NAME]`: drain in-flight requests, stop the engine, leave nothing running."""
from __future__ import annotations

import os
import signal
import time

import click

from .. import console, errors
from ..runtime import runtime_class
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
    return runtime_class(st.runtime).leftovers(st)
