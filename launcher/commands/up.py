"""`radiance up PROFILE`: check, start the engine with the plugin, gate, then expose."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import click

from .. import console, errors, paths
from ..state import DeploymentState
from ..supervisor import Supervisor, UpOptions
from ._common import PROFILE_ARG, check_knobs, load, runnable_here

TERMINAL = {"ready", "unready", "failed", "stopped"}


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
@click.option("--runtime", type=click.Choice(["local", "docker", "ray"]), default=None,
              help="Where the engine runs; default: the profile's runtime.kind. ray: --replicas gated "
                   "replicas as a Ray Serve application.")
@click.option("--replicas", "replicas_raw", default=None, metavar="N",
              help="--runtime ray: how many replicas (each one the whole appliance with its own gate); default 1.")
@click.option("--address", default=None, envvar="RAY_ADDRESS",
              help="--runtime ray: the Ray cluster to join (env RAY_ADDRESS); default: start a local one.")
@click.option("--detach", "-d", is_flag=True, help="Return once ready (or failed); keep serving in the background.")
@click.option("--port", type=int, default=None, envvar="RADIANCE_PORT",
              help="Public port of the gateway (overrides server.port; env RADIANCE_PORT).")
@click.option("--skip-gate", is_flag=True, help="Expose the endpoint WITHOUT running the gate (recorded, loud).")
@click.option("--keep-serving-unready", is_flag=True,
              help="When the gate fails, keep the engine and gateway up (ready stays 503) instead of exiting.")
@click.option("--gate-only", is_flag=True, help="Bring up, run the gate, print the report, shut down.")
@click.option("--image", default=None, help="Docker runtime: the image to run (default: the profile's or computed tag).")
@click.option("--supervised", is_flag=True, hidden=True)
@click.option("--resolved-platform", default="cpu", hidden=True)
@click.pass_context
def command(ctx: click.Context, profile_path: str, runtime: str | None, replicas_raw: str | None,
            address: str | None, detach: bool, port: int | None, skip_gate: bool, keep_serving_unready: bool,
            gate_only: bool, image: str | None, supervised: bool, resolved_platform: str) -> None:
    """Start PROFILE: validate, check the hardware, start vLLM with the radiance plugin, run the
    gate, and expose the OpenAI-compatible endpoint only once it passes.

    /v1/health/live answers at once; /v1/health/ready is 503 until the gate has passed.
    """
    profile = load(profile_path)
    check_knobs()
    if port is not None and port != profile.server.port:
        profile = profile.model_copy(update={"server": profile.server.model_copy(update={"port": port})})
    runtime = runtime or profile.runtime.kind
    if skip_gate and gate_only:
        raise errors.UsageError("--skip-gate and --gate-only contradict each other — fix: drop one")
    # RAY_ADDRESS in the environment means nothing to the other runtimes; --address on the line does.
    address_given = ctx.get_parameter_source("address") == click.core.ParameterSource.COMMANDLINE
    replicas = _ray_options(runtime, replicas_raw, address if runtime == "ray" else None, address_given,
                            skip_gate, keep_serving_unready, image)
    if runtime != "ray":
        address = None
    if skip_gate:
        console.warn("--skip-gate: the endpoint will be exposed WITHOUT its gate; this is recorded in its status")

    running = _existing(profile.name)
    if running is not None and not supervised:
        raise errors.LauncherError(f"deployment {profile.name!r} is already running (pid "
                                   f"{running.supervisor_pid}, {running.gateway_url}) — fix: "
                                   f"`radiance down {profile.name}` first")

    if not supervised and runtime == "ray" and address:
        # The replicas run on the cluster's nodes, not here: each engine meets its hardware there.
        if profile.runtime.platform == "auto":
            raise errors.UsageError(f"{profile_path}: runtime.platform is auto, which says nothing of the Ray "
                                    "cluster's nodes — fix: set runtime.platform to rocm, cuda or cpu")
        platform = profile.runtime.platform
    elif not supervised:
        # A local Ray cluster runs on this machine: the same hardware verdict as the local runtime's.
        platform = runnable_here(profile, profile_path, "local" if runtime == "ray" else runtime).platform
    else:
        platform = resolved_platform

    if detach and not supervised:
        ray_args = ("--replicas", str(replicas)) + (("--address", address) if address else ()) \
            if runtime == "ray" else ()
        code = _spawn_detached(profile.name, profile_path, runtime, platform, profile.server.port, skip_gate,
                               keep_serving_unready, image, ray_args)
        sys.exit(code)

    opts = UpOptions(runtime=runtime, platform=platform, skip_gate=skip_gate,
                     keep_serving_unready=keep_serving_unready and not gate_only, image=image,
                     replicas=replicas, ray_address=address)
    code = _run_foreground(profile, profile_path, opts, quiet=supervised, gate_only=gate_only)
    sys.exit(code)


def _ray_options(runtime: str, replicas_raw: str | None, address: str | None, address_given: bool,
                 skip_gate: bool, keep_serving_unready: bool, image: str | None) -> int:
    """--replicas and --address belong to --runtime ray, and ray has no gate to skip; returns the
    replica count."""
    if runtime != "ray":
        for given, flag in ((replicas_raw is not None, "--replicas"), (address_given, "--address")):
            if given:
                raise errors.UsageError(f"{flag} needs --runtime ray (the {runtime} runtime runs one engine) — "
                                        f"fix: add --runtime ray or drop {flag}")
        return 1
    try:
        replicas = int(replicas_raw) if replicas_raw is not None else 1
    except ValueError:
        replicas = 0
    if replicas < 1:
        raise errors.UsageError(f"--replicas {replicas_raw!r}: expected a whole number >= 1 — fix: e.g. --replicas 2")
    for given, flag, why in ((skip_gate, "--skip-gate", "a replica takes traffic only once its own gate passed"),
                             (keep_serving_unready, "--keep-serving-unready",
                              "Serve replaces a replica that failed its gate, the others keep serving"),
                             (image is not None, "--image", "each replica runs vLLM in its node's Python")):
        if given:
            raise errors.UsageError(f"{flag} does not apply to --runtime ray ({why}) — fix: drop {flag}")
    if address is not None and not address.strip():
        raise errors.UsageError("--address is empty — fix: the Ray cluster's address (host:port of its GCS, "
                                "or ray://host:10001), or leave it out for a local cluster")
    from ..runtime.ray_cluster import require_ray

    require_ray()
    return replicas


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


def _run_foreground(profile, profile_path: str, opts: UpOptions, *, quiet: bool, gate_only: bool) -> int:
    _configure_logging(profile.name, quiet)
    status = None if quiet else console.err.status(f"{profile.name}: starting", spinner="dots")

    def progress(phase: str, detail: str) -> None:
        line = f"{profile.name}: {phase} — {detail}" if detail else f"{profile.name}: {phase}"
        if status is not None:
            status.update(line)
        else:
            print(f"[radiance] {line}", file=sys.stderr, flush=True)

    sup = Supervisor(profile, profile_path, opts, progress=progress)

    async def main() -> int:
        if gate_only:
            # Stop as soon as the gate has decided.
            async def stop_when_decided():
                while sup.gw_state.phase not in ("ready", "unready", "failed"):
                    await asyncio.sleep(0.5)
                sup._stop.set()

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
                    keep: bool, image: str | None, extra: tuple[str, ...] = ()) -> int:
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
    if image:
        argv += ["--image", image]
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

