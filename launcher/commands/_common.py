"""Pieces every subcommand shares: loading a profile into a one-line error, knob checks, picking a deployment."""
from __future__ import annotations

import click

from radiance import envs

from .. import errors
from ..profile import Profile, ProfileError, load_profile
from ..state import DeploymentState, all_deployments

PROFILE_ARG = click.argument("profile_path", metavar="PROFILE", type=click.Path(dir_okay=False),
                             envvar="RADIANCE_PROFILE")
JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")


def load(path: str) -> Profile:
    try:
        return load_profile(path)
    except ProfileError as exc:
        raise errors.UsageError("\n".join(exc.lines)) from None


def check_knobs() -> None:
    problems = envs.validate_all()
    if problems:
        raise errors.UsageError(problems[0] + " — fix: correct or unset it (see radiance/envs.py)")
    for name in envs.unknown_names():
        from .. import console

        console.warn(f"{name} is set but is not a RADIANCE_* knob; ignored (see radiance/envs.py)")


def runnable_here(profile: Profile, profile_path: str, runtime: str | None = None):
    """The machine's verdict on PROFILE (without the engine's own checks); each failure printed and the
    command ended with exit 4 when it cannot run here."""
    from .. import console, preflight

    rep = preflight.assess(profile, runtime=runtime, capabilities=False)
    if not rep.compatible:
        for f in rep.findings:
            if f.status == "fail":
                console.error(f"{f.check}: {f.detail}")
        raise errors.LauncherError(f"{profile.name} cannot run here (see `radiance check {profile_path}`)",
                                   errors.INCOMPATIBLE)
    return rep


def pick_deployment(name: str | None, live_only: bool = False) -> DeploymentState:
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
