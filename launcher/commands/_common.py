"""Pieces every subcommand shares: loading a profile into a one-line error, knob checks."""
from __future__ import annotations

import click

from radiance import envs

from .. import errors
from ..profile import Profile, ProfileError, load_profile

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
