"""`radiance up PROFILE`: check, start the engine with the plugin, gate, then expose."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import click

from .. import console, errors, paths, platforms
from .. import profile as profile_schema
from ..state import DeploymentState
from ..supervisor import Supervisor, UpOptions
from ._common import PROFILE_ARG, check_knobs, check_vllm_args, load, runnable_here

TERMINAL = {"ready", "unready", "failed", "stopped"}
RUNTIME_KINDS = list(typing.get_args(profile_schema.Runtime.model_fields["kind"].annotation))


def _existing(name: str) -> DeploymentState | None:
    st = DeploymentState.load(name)
    if st is not None and st.supervisor_alive() and st.phase not in ("stopped",):
        return st
    return None


def _print_result(st: DeploymentState | None, code: int) -> None:
    if st is None:
        return
    if st.ready:
        console.out.print(f"[green]ready[/green]  {st.gateway_url}/v1  (gate: {st.reason}; "
                          f"`radiance status {st.name}`, `radiance down {st.name}`)")
    elif code == errors.GATE_FAILED:
        console.out.print(f"[red]gate failed[/red]: {st.reason.removeprefix('gate failed: ')}")
        if st.gate_report:
            console.out.print(f"report: {st.gate_report}")


@click.command("up")
@PROFILE_ARG
@click.option("--runtime", type=click.Choice(RUNTIME_KINDS), default=None,
              help="Where the engine runs; default: the profile's runtime.kind. ray: --replicas gated "
                   "replicas as a Ray Serve application.")
@click.option("--replicas", "replicas_raw", default=None, metavar="N",
              help="--runtime ray: how many replicas (each one the whole appliance with its own gate); default: "
                   "the profile's runtime.replicas (1).")
@click.option("--address", default=None, envvar="RAY_ADDRESS",
              help="--runtime ray: the Ray cluster to join; default: the profile's runtime.address, else env "
                   "RAY_ADDRESS, else start a local one.")
@click.option("--detach", "-d", is_flag=True, help="Return once ready (or failed); keep serving in the background.")
@click.option("--port", type=int, default=None, envvar="RADIANCE_PORT",
              help="Public port of the gateway (overrides server.port; env RADIANCE_PORT).")
@click.option("--skip-gate", is_flag=True, help="Expose the endpoint WITHOUT running the gate (recorded, loud).")
@click.option("--keep-serving-unready", is_flag=True,
              help="When the gate fails, keep the engine and gateway up (ready stays 503) instead of exiting.")
@click.option("--gate-only", is_flag=True, help="Bring up, run the gate, print the report, shut down.")
@click.option("--image", default=None, help="Docker runtime: the image to run (default: the profile's or computed tag).")
@click.option("--supervised", is_flag=True, hidden=True)
@click.option("--resolved-platform", default=platforms.CPU.name, hidden=True)
@click.pass_context
def command(ctx: click.Context, profile_path: str, runtime: str | None, replicas_raw: str | None,
            address: str | None, detach: bool, port: int | None, skip_gate: bool, keep_serving_unready: bool,
            gate_only: bool, image: str | None, supervised: bool, resolved_platform: str) -> None:
    """Start PROFILE: validate, check the hardware, start vLLM with the radiance plugin, run the
    gate, and expose the OpenAI-compatible endpoint only once it passes.

    /v1/health/live answers at once; /v1/health/ready is 503 until the gate has passed.
    """
    profile = load(profile_path)
    kind = runtime or profile.runtime.kind
    if not supervised:  # the supervisor's parent checked them; a profile error is exit 2 before any hardware verdict
        from ..runtime import runtime_class

        check_vllm_args(profile, profile_path, runtime_class(kind).hardware)
    check_knobs()
    if port is not None and port != profile.server.port:
        profile = profile.model_copy(update={"server": profile.server.model_copy(update={"port": port})})
    if skip_gate and gate_only:
        raise errors.UsageError("--skip-gate and --gate-only contradict each other — fix: drop one")
    # RAY_ADDRESS in the environment means nothing to the other runtimes; --address on the line does.
    address_given = ctx.get_parameter_source("address") == click.core.ParameterSource.COMMANDLINE
    rt = _runtime(kind, profile, {"--replicas": replicas_raw, "--address": address if address_given else None,
                                  "--image": image, "--skip-gate": skip_gate or None,
                                  "--keep-serving-unready": keep_serving_unready or None})
    if skip_gate:
        console.warn("--skip-gate: the endpoint will be exposed WITHOUT its gate; this is recorded in its status")

    running = _existing(profile.name)
    if running is not None and not supervised:
        raise errors.LauncherError(f"deployment {profile.name!r} is already running (pid "
                                   f"{running.supervisor_pid}, {running.gateway_url}) — fix: "
                                   f"`radiance down {profile.name}` first")

    elsewhere = rt.elsewhere()
    if not supervised and elsewhere:
        # The engines run on other machines: each meets its hardware there.
        if profile.runtime.platform == "auto":
            raise errors.UsageError(f"{profile_path}: runtime.platform is auto, which says nothing of {elsewhere} "
                                    "— fix: set runtime.platform to rocm, cuda or cpu")
        platform = profile.runtime.platform
    elif not supervised:
        platform = runnable_here(profile, profile_path, rt.hardware).platform
    else:
        platform = resolved_platform

    if detach and not supervised:
        code = _spawn_detached(profile.name, profile_path, kind, platform, profile.server.port, skip_gate,
                               keep_serving_unready, rt.argv())
        sys.exit(code)

    opts = UpOptions(platform=platform, skip_gate=skip_gate,
                     keep_serving_unready=keep_serving_unready and not gate_only)
    code = run_foreground(profile, profile_path, opts, rt, quiet=supervised, gate_only=gate_only)
    sys.exit(code)


def _runtime(kind: str, profile, given: dict[str, object]):
    """The runtime ``kind`` built from the profile and the `up` options given (flag -> value, None where
    not given): an option another runtime takes, or one this runtime refuses, is a usage error."""
    from ..runtime import RUNTIMES, runtime_class

    cls = runtime_class(kind)
    owners = {flag: other for other in RUNTIMES if other != kind for flag in runtime_class(other).takes}
    for flag, value in given.items():
        if value is not None and flag in owners and flag not in cls.takes:
            raise errors.UsageError(f"{flag} needs --runtime {owners[flag]} (the {kind} runtime runs one engine) — "
                                    f"fix: add --runtime {owners[flag]} or drop {flag}")
    for flag, why in cls.refuses.items():
        if given.get(flag) is not None:
            raise errors.UsageError(f"{flag} does not apply to --runtime {kind} ({why}) — fix: drop {flag}")
    return cls.from_profile(profile, replicas=given["--replicas"], address=given["--address"],
                            image=given["--image"])


def _configure_logging(name: str, quiet: bool) -> None:
    """The gateway's access lines and the supervisor's warnings: on stderr when nobody watches a
    spinner (detached: stderr is supervisor.log; compose: `docker compose logs`), else appended to
    the deployment's supervisor.log so they do not tear through the progress line."""
    if quiet:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        d = paths.deployment_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(d / "supervisor.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger("radiance")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def run_foreground(profile, profile_path: str, opts: UpOptions, runtime, *, quiet: bool, gate_only: bool) -> int:
    _configure_logging(profile.name, quiet)
    status = None if quiet else console.err.status(f"{profile.name}: starting", spinner="dots")

    def progress(phase: str, detail: str) -> None:
        line = f"{profile.name}: {phase} — {detail}" if detail else f"{profile.name}: {phase}"
        if status is not None:
            status.update(line)
        else:
            print(f"[radiance] {line}", file=sys.stderr, flush=True)

    sup = Supervisor(profile, profile_path, opts, runtime, progress=progress)

    async def main() -> int:
        if gate_only:
            # Stop as soon as the gate has decided.
            async def stop_when_decided():
                while sup.gw_state.phase not in ("ready", "unready", "failed"):
                    await asyncio.sleep(0.5)
                sup.stopping.set()

            watcher = asyncio.create_task(stop_when_decided())
            try:
                return await sup.run()
            finally:
                watcher.cancel()
        return await sup.run()

    if status is not None:
        status.start()
    try:
        code = asyncio.run(main())
    finally:
        if status is not None:
            status.stop()
    st = DeploymentState.load(profile.name)
    if not quiet:
        _print_result(st, code)
        if st is not None and st.gate_report and (gate_only or code == errors.GATE_FAILED):
            _print_gate_report(st.gate_report)
    return code


def _print_gate_report(path: str) -> None:
    try:
        from ..gate import report as gate_report
        from ..gate.result import GateReport

        gate_report.render_table(GateReport.from_json(Path(path).read_text()), console.out)
    except Exception as exc:  # the saved JSON is the record; the table is a courtesy
        console.warn(f"could not render the gate report ({exc}); it is saved at {path}")


def _spawn_detached(name: str, profile_path: str, runtime: str, platform: str, port: int, skip_gate: bool,
                    keep: bool, extra: tuple[str, ...] = ()) -> int:
    d = paths.deployment_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    for stale in ("state.json",):
        (d / stale).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "launcher", "up", profile_path, "--supervised", "--runtime", runtime,
            "--port", str(port), "--resolved-platform", platform]
    if skip_gate:
        argv.append("--skip-gate")
    if keep:
        argv.append("--keep-serving-unready")
    argv += extra
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(d / "supervisor.log", "ab") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True, cwd=os.getcwd())
    last = ""
    with console.err.status(f"{name}: starting (pid {child.pid})", spinner="dots") as status:
        while True:
            rc = child.poll()
            st = DeploymentState.load(name)
            if st is not None and st.supervisor_pid == child.pid:
                line = f"{name}: {st.phase} — {st.reason}"
                if line != last:
                    status.update(line)
                    last = line
                if st.phase in TERMINAL:
                    break
            if rc is not None:
                break
            time.sleep(0.5)
    st = DeploymentState.load(name)
    if st is not None and st.phase == "ready":
        _print_result(st, 0)
        return errors.OK
    if rc is None and st is not None and st.phase == "unready":
        _print_result(st, errors.GATE_FAILED)
        return errors.GATE_FAILED
    # The supervisor ended: its exit code says why; its log has the detail.
    rc = child.wait(timeout=120) if rc is None else rc
    st = DeploymentState.load(name)
    if st is not None:
        _print_result(st, rc)
    if rc not in (errors.OK, errors.GATE_FAILED):
        tail = _tail(d / "supervisor.log", 3)
        console.error(f"{name} did not come up (exit {rc}); supervisor log {d / 'supervisor.log'}:\n{tail}")
    return rc if rc else errors.RUNTIME_ERROR


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""

