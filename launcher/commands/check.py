"""`radiance check PROFILE`: validate, probe, report per feature; no side effects."""
from __future__ import annotations

import sys

import click

from .. import console, errors, preflight
from ..images import GPU_TARGETS
from ..runtime import runtime_class

GPU_ARCHS = {a for targets in GPU_TARGETS.values() for a in targets}
from ._common import JSON_OPT, PROFILE_ARG, check_knobs, load


def render(rep: preflight.PreflightReport) -> None:
    rows = [[f.check, console.styled(f.status), f.detail] for f in rep.findings]
    console.out.print(console.table(f"radiance check — {rep.profile} ({rep.runtime}, {rep.platform})",
                                    ["check", "status", "detail"], rows))
    verdict = "[green]compatible[/green]" if rep.compatible else "[red]incompatible[/red]"
    console.out.print(f"verdict: {verdict}")


@click.command("check")
@PROFILE_ARG
@JSON_OPT
@click.option("--runtime", type=click.Choice(["local", "docker"]), default=None,
              help="Check for this runtime instead of the profile's runtime.kind.")
@click.option("--strict", is_flag=True, help="A feature that would be declined makes the profile incompatible.")
@click.option("--arch", "archs", multiple=True, type=click.Choice(sorted(GPU_ARCHS)),
              help="Also compile the kernels for this GPU arch (repeatable), e.g. --arch gfx942 --arch sm90.")
def command(profile_path: str, as_json: bool, runtime: str | None, strict: bool, archs: tuple[str, ...]) -> None:
    """Validate PROFILE, probe the GPUs and explain every feature: requested or not, whether it
    applies to this model and setup and why not, whether its kernels build for the target arch.

    Exits 0 when compatible, 4 when not, 2 when the profile is invalid. PROFILE defaults to
    $RADIANCE_PROFILE.
    """
    profile = load(profile_path)
    check_knobs()
    # A ray profile's local cluster meets this machine as the local runtime does.
    rep = preflight.assess(profile, runtime=runtime or runtime_class(profile.runtime.kind).hardware, archs=archs)
    if strict:
        for f in rep.findings:
            if f.check.startswith("feature ") and f.status == "warn":
                f.status = "fail"
    if as_json:
        console.print_json(rep.to_dict())
    else:
        render(rep)
    # vLLM's parser refusing a flag is a mistake in the profile, not a machine that cannot run it.
    refused = [f.detail for f in rep.findings if f.check == "vllm_args" and f.status == "fail"]
    if refused:
        raise errors.UsageError("\n".join(vllm_args_lines(profile_path, refused)))
    sys.exit(errors.OK if rep.compatible else errors.INCOMPATIBLE)


def vllm_args_lines(profile_path: str, problems: list[str]) -> list[str]:
    """``FILE:LINE: vllm_args.KEY: ...`` for each of vLLM's refusals (which name their key first)."""
    from ..profile import line_of

    out = []
    for problem in problems:
        key = problem.split(":", 1)[0].removeprefix("vllm_args.")
        line = line_of(profile_path, ("vllm_args", key))
        out.append(f"{profile_path}:{line}: {problem}" if line else f"{profile_path}: {problem}")
    return out
