"""`radiance logs NAME`: the engine's log (and the supervisor's with --supervisor)."""
from __future__ import annotations

from collections import deque

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
    if st.runtime == "ray" and not supervisor:
        _ray_logs(st, follow, tail)
        return
    # Both runtimes write the engine's output to the same file (docker mirrors the container's logs).
    path = st.supervisor_log if supervisor else st.engine_log
    if tail is not None:
        for line in deque(follow_file(path, follow=False, alive=lambda: False), maxlen=tail):
            click.echo(line)
        if not follow:
            return
        lines = _new_lines(path, st)
    else:
        lines = follow_file(path, follow=follow, alive=st.supervisor_alive)
    for line in lines:
        click.echo(line)


def _new_lines(path: str, st: DeploymentState):
    """Lines appended to path from now on, while the deployment's supervisor lives."""
    import os
    import time

    with open(path, errors="replace") as f:
        f.seek(0, os.SEEK_END)
        while st.supervisor_alive():
            line = f.readline()
            if line:
                yield line.rstrip("\n")
            else:
                time.sleep(0.25)


def _pick(name: str | None) -> DeploymentState:
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
    if not live and len(states) == 1:
        return states[0]
    among = live or states
    raise errors.UsageError(f"{len(among)} {'running ' if live else ''}deployments — fix: name one: "
                            + ", ".join(s.name for s in among))


def _ray_logs(st: DeploymentState, follow: bool, tail: int | None) -> None:
    """Each replica's log (its own lines and its engine's), from whichever node it ran on, through Ray's
    state API; prefixed with the replica's actor id."""
    if follow:
        raise errors.UsageError("--follow is not available for --runtime ray — fix: run it again, or "
                                "`ray logs actor --id ID --follow` for one replica")
    if not st.supervisor_alive() or not st.ray_address:
        raise errors.UsageError(f"{st.name} is not running: its replicas' logs lived on the Ray cluster — fix: "
                                "`radiance logs --supervisor` for the launcher's side")
    from ..runtime.ray_cluster import RayCluster

    cluster = RayCluster(st.name, st.ray_address)
    cluster.connect()
    lines = (f"[{actor}] {line}" for actor, line in cluster.replica_logs())
    for line in (deque(lines, maxlen=tail) if tail is not None else lines):
        click.echo(line)
