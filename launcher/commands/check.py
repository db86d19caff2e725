"""`radiance check PROFILE`: validate, probe, report per feature; no side effects."""
from __future__ import annotations

import sys

import click

from .. import console, errors, preflight
from ..images import GPU_TARGETS
from ..runtime import runtime_class

GPU_ARCHS = {a for targets in GPU_TARGETS.values() for a in targets}
from ._common import JSON_OPT, PROFILE_ARG, check_knobs, check_vllm_args, load


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
    # A ray profile's local cluster meets this machine as the local runtime does.
    runtime = runtime or runtime_class(profile.runtime.kind).hardware
    # vLLM's parser refusing a flag is a mistake in the profile, not a machine that cannot run it: exit 2
    # in one line before anything is probed or printed.
    args_finding = check_vllm_args(profile, profile_path, runtime)
    check_knobs()
    rep = preflight.assess(profile, runtime=runtime, archs=archs)
    if args_finding is not None:  # its row before the features', where the engine's rows end
        at = next((i for i, f in enumerate(rep.findings) if f.check.startswith("feature ")), len(rep.findings))
        rep.findings.insert(at, preflight.Finding("vllm_args", *args_finding))
    if strict:
        for f in rep.findings:
            if f.check.startswith("feature ") and f.status == "warn":
                f.status = "fail"
    if as_json:
        console.print_json(rep.to_dict())
    else:
        render(rep)
    sys.exit(errors.OK if rep.compatible else errors.INCOMPATIBLE)
