"""`radiance logs NAME`: the engine's log (and the supervisor's with --supervisor)."""
from __future__ import annotations

import click

from .. import errors
from ..runtime import runtime_class
from ..runtime.base import log_file_lines
from ..state import DeploymentState, all_deployments


@click.command("logs")
@click.argument("name", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines while the deployment runs.")
@click.option("--supervisor", is_flag=True, help="Show the launcher's own log instead of the engine's.")
@click.option("--tail", "-n", type=int, default=None, help="Only the last N lines.")
def command(name: str | None, follow: bool, supervisor: bool, tail: int | None) -> None:
    """Print the engine log of deployment NAME (the only one, when NAME is omitted)."""
    st = _pick(name)
    if supervisor:
        lines = log_file_lines(st.supervisor_log, st, follow, tail)
    else:
        lines = runtime_class(st.runtime).logs(st, follow, tail)
    for line in lines:
        click.echo(line)


def _pick(name: str | None, live_only: bool = False) -> DeploymentState:
    """The deployment NAME, or with no name the one that is running. ``live_only``: a stopped one will not
    do (the command needs its endpoint)."""
    if name:
        st = DeploymentState.load(name)
        if st is None:
            raise errors.UsageError(f"no deployment named {name!r} — fix: `radiance status` lists them")
        return st
    states = all_deployments()
    if not states:
        raise errors.UsageError("no deployments — fix: `radiance up PROFILE` first")
    # A bare command means the deployment that is running; stopped ones only count when nothing runs.
    live = [s for s in states if s.phase != "stopped" and s.supervisor_alive()]
    if len(live) == 1:
        return live[0]
    if not live and live_only:
        raise errors.UsageError("no deployment is running — fix: `radiance up PROFILE` first, or name a "
                                "profile and an endpoint (PROFILE --url URL)")
    if not live and len(states) == 1:
        return states[0]
    among = live or states
    raise errors.UsageError(f"{len(among)} {'running ' if live else ''}deployments — fix: name one: "
                            + ", ".join(s.name for s in among))
