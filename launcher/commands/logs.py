"""`radiance logs NAME`: the engine's log (and the supervisor's with --supervisor)."""
from __future__ import annotations

import click

from .. import errors
from ..runtime.local import follow_file
from ..state import DeploymentState, all_deployments


@click.command("logs")
@click.argument("name", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines while the deployment runs.")
@click.option("--supervisor", is_flag=True, help="Show the launcher's own log instead of the engine's.")
@click.option("--tail", "-n", type=int, default=None, help="Only the last N lines.")
def command(name: str | None, follow: bool, supervisor: bool, tail: int | None) -> None:
    """Print the engine log of deployment NAME (the only one, when NAME is omitted)."""
    st = _pick(name)
    path = st.supervisor_log if supervisor else st.engine_log
    if st.runtime == "docker" and not supervisor and st.engine_ident:
        try:
            from ..runtime.docker import container_logs
        except ImportError:
            container_logs = None
        if container_logs is not None:
            for line in container_logs(st.engine_ident, follow=follow, tail=tail):
                click.echo(line)
            return
    lines = follow_file(path, follow=False, alive=lambda: False)
    if tail is not None:
        from collections import deque

        lines = iter(deque(lines, maxlen=tail))
    for line in lines:
        click.echo(line)
    if follow:
        # Re-open at the end and keep going while the supervisor lives.
        import os

        with open(path, errors="replace") as f:
            f.seek(0, os.SEEK_END)
            import time

            while st.supervisor_alive():
                line = f.readline()
                if line:
                    click.echo(line.rstrip("\n"))
                else:
                    time.sleep(0.25)


def _pick(name: str | None) -> DeploymentState:
    if name:
        st = DeploymentState.load(name)
        if st is None:
            raise errors.UsageError(f"no deployment named {name!r} — fix: `radiance status` lists them")
        return st
    states = all_deployments()
    if len(states) == 1:
        return states[0]
    if not states:
        raise errors.UsageError("no deployments — fix: `radiance up PROFILE` first")
    raise errors.UsageError("several deployments — fix: name one: " + ", ".join(s.name for s in states))
