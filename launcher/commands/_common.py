"""Pieces every subcommand shares: loading a profile into a one-line error (its schema, its cross-field
rules, then vLLM's own parser on its vllm_args), knob checks, picking a deployment."""
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


def check_vllm_args(profile: Profile, profile_path: str, runtime: str = "local") -> tuple[str, str] | None:
    """vLLM's own parser on the profile's ``vllm_args``, before any hardware verdict and on every platform:
    a flag it refuses is a profile error, one line ``FILE:LINE: vllm_args.KEY: problem — fix: ...`` per
    flag, exit 2. Each flag's verdict is kept (launcher.preflight.vllm_args_problems), so only a flag not
    judged before costs vLLM's import (~15 s on two cores). ``runtime``: where the engine runs; elsewhere
    than this Python (docker, k8s), this Python's vLLM judges only when it is the pinned version the image
    carries. Returns `radiance check`'s finding (status, detail), None where there are no vllm_args."""
    if not profile.vllm_args:
        return None
    from radiance.versions import VLLM_VERSION

    from .. import preflight

    ident = preflight._vllm_identity()
    if ident is None:
        return "warn", "not checked: vLLM is not installed in this Python (the engine's parser reads them)"
    here = {v.split("+")[0] for v in ident["versions"].values()}
    if runtime != "local" and VLLM_VERSION not in here:
        return "warn", (f"not checked: this Python's vLLM ({', '.join(sorted(here)) or 'unknown version'}) is "
                        f"not the image's {VLLM_VERSION}")
    try:
        found = preflight.vllm_args_problems(profile.vllm_args)
    except (RuntimeError, OSError, ValueError, preflight.subprocess.TimeoutExpired) as exc:
        return "warn", f"not checked: {exc}"
    if found:
        raise errors.UsageError("\n".join(vllm_args_lines(profile_path, found)))
    return "ok", f"{len(profile.vllm_args)} flag(s) accepted by vLLM's parser"


def vllm_args_lines(profile_path: str, problems: list[str]) -> list[str]:
    """``FILE:LINE: vllm_args.KEY: ...`` for each of vLLM's refusals (which name their key first)."""
    from ..profile import line_of

    out = []
    for problem in problems:
        key = problem.split(":", 1)[0].removeprefix("vllm_args.")
        line = line_of(profile_path, ("vllm_args", key))
        out.append(f"{profile_path}:{line}: {problem}" if line else f"{profile_path}: {problem}")
    return out


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
