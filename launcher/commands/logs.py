"""`radiance logs NAME`: the engine's log (and the supervisor's with --supervisor)."""
from __future__ import annotations

import click

from ..runtime import runtime_class
from ..runtime.base import log_file_lines
from ._common import pick_deployment


@click.command("logs")
@click.argument("name", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines while the deployment runs.")
@click.option("--supervisor", is_flag=True, help="Show the launcher's own log instead of the engine's.")
@click.option("--tail", "-n", type=int, default=None, help="Only the last N lines.")
def command(name: str | None, follow: bool, supervisor: bool, tail: int | None) -> None:
    """Print the engine log of deployment NAME (the only one, when NAME is omitted)."""
    st = pick_deployment(name)
    if supervisor:
        lines = log_file_lines(st.supervisor_log, st, follow, tail)
    else:
        lines = runtime_class(st.runtime).logs(st, follow, tail)
    for line in lines:
        click.echo(line)
