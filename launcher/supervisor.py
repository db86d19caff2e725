"""One deployment's life: engine up, gateway up, gate, ready, drain, down.

Runs in the foreground of `radiance up` or, with --detach, in a background process of its
own; either way it writes the deployment state that `status`/`logs`/`down` read.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from radiance import envs

from . import engine_args, engine_link, errors, paths, procs
from .gate import verdict
from .engine_link import EngineLink
from .gateway import Gateway, GatewayState
from .profile import Profile
from .runtime.base import EngineHandle, EngineSpec
from .state import DeploymentState

log = logging.getLogger("radiance.supervisor")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@dataclass
class UpOptions:
    runtime: str
    platform: str
    skip_gate: bool = False
    keep_serving_unready: bool = False
    image: str | None = None
    engine_url: str | None = None       # runtime "external": an engine someone else runs
    engine_key: str | None = None       # ... and the key it wants (its VLLM_API_KEY), if any
    replicas: int = 1                   # runtime "ray": how many gated replicas Serve runs
    ray_address: str | None = None      # runtime "ray": the cluster to join; None: a local one of ours


class Supervisor:
    def __init__(self, profile: Profile, profile_path: str, opts: UpOptions,
                 progress: Callable[[str, str], None] | None = None):
        self.profile = profile
        self.profile_path = profile_path
        self.opts = opts
        self.progress = progress or (lambda phase, detail: None)
        self.name = profile.name
        self.dir = paths.deployment_dir(self.name)
        self.gw_state = GatewayState()
        self.handle: EngineHandle | None = None
        self.runtime = None
        self.state: DeploymentState | None = None
        self._stop = asyncio.Event()
        self.exit_code = errors.OK
        self.link: EngineLink | None = None
        self.socket_dir: Path | None = None
        self.cluster = None                 # runtime "ray": launcher.runtime.ray_cluster.RayCluster
        self._gate_failure: str | None = None   # runtime "ray": the last replica gate failure Serve reported

    # -- helpers ---------------------------------------------------------------------------
    def _phase(self, phase: str, reason: str = "", ready: bool = False) -> None:
        self.gw_state.set(phase, reason, ready)
        if self.state is not None:
            self.state.phase, self.state.reason, self.state.ready = phase, reason, ready
            self.state.save()
        self.progress(phase, reason)

    def _api_key(self) -> str | None:
        env_name = self.profile.server.api_key_env
        if not env_name:
            return None
        key = os.environ.get(env_name)
        if not key:
            raise errors.UsageError(f"server.api_key_env names {env_name}, which is not set — fix: "
                                    f"export {env_name}=<key> before `radiance up`")
        return key

    def _make_runtime(self):
        if self.opts.runtime == "local":
            from .runtime.local import LocalRuntime

            return LocalRuntime()
        if self.opts.runtime == "docker":
            from .runtime.docker import DockerRuntime

            return DockerRuntime()
        return None

    async def _engine_alive(self) -> bool:
        # The docker runtime asks the daemon: never on the event loop the gateway serves from.
        return await asyncio.to_thread(self.runtime.alive, self.handle)

    async def _wait_engine(self, timeout: float) -> None:
        async def alive() -> bool:
            return self.handle is None or await self._engine_alive()

        def waiting(seconds: float) -> None:
            self._phase("loading", f"engine loading, {seconds:.0f}s — {self._last_log_line()}")
            if self._stop.is_set():
                raise asyncio.CancelledError

        try:
            await engine_link.wait_healthy(self.link, timeout, alive=alive, waiting=waiting)
        except engine_link.EngineExited:
            raise errors.LauncherError(
                f"the engine exited while loading; see `radiance logs {self.name}` "
                f"({self.state.engine_log if self.state else ''})") from None
        except engine_link.EngineTimeout:
            raise errors.LauncherError(
                f"the engine was not healthy after {timeout:.0f}s — fix: raise "
                f"runtime.startup_timeout_s or see `radiance logs {self.name}`") from None

    def _last_log_line(self) -> str:
        if self.state is None or not self.state.engine_log:
            return ""
        try:
            with open(self.state.engine_log, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][-160:] if lines else ""

    # -- the run ---------------------------------------------------------------------------
    async def run(self) -> int:
        p = self.profile
        host, public_port = p.server.host, p.server.port
        api_key = self._api_key()
        if port_in_use(host, public_port):
            raise errors.LauncherError(f"{host}:{public_port} is already in use — fix: stop what holds it "
                                       f"(`radiance status`) or set server.port in the profile")
        self.dir.mkdir(parents=True, exist_ok=True)
        engine_log = self.dir / "engine.log"
        if engine_log.exists():
            engine_log.replace(self.dir / "engine.log.1")

        if self.opts.runtime == "external":
            self.link = EngineLink(self.opts.engine_url.rstrip("/"), self.opts.engine_key)
        elif self.opts.runtime == "ray":
            from .runtime.ray_cluster import RayCluster

            # Each replica holds its own engine link on its node; the gateway reaches them through Serve.
            self.cluster = RayCluster(self.name, self.opts.ray_address)
        else:
            # The engine's only door: a socket in a directory of ours, and a key of this deployment's.
            self.socket_dir = engine_link.private_socket_dir(group_access=self.opts.runtime == "docker")
            self.link = EngineLink(f"{engine_link.UNIX}{self.socket_dir / engine_link.SOCKET_NAME}",
                                   engine_link.new_key())
        engine_url = self.link.address if self.link is not None else f"ray:{self.name}"

        self.state = DeploymentState(
            name=self.name, profile_path=str(Path(self.profile_path).resolve()),
            profile_hash=p.fingerprint(), runtime=self.opts.runtime,
            gateway_url=f"http://{host}:{public_port}", engine_url=engine_url,
            supervisor_pid=os.getpid(), supervisor_started=procs.start_time(os.getpid()), engine_log=str(engine_log),
            supervisor_log=str(self.dir / "supervisor.log"), api_key_env=p.server.api_key_env)
        self.state.save()

        drain = envs.get("RADIANCE_DRAIN_TIMEOUT")
        if self.cluster is not None:
            from .runtime.ray_cluster import RayGateway

            gateway = RayGateway(self.cluster, self.gw_state, api_key=api_key, drain_timeout=drain)
        else:
            gateway = Gateway(self.link, self.gw_state, api_key=api_key, drain_timeout=drain)
        await gateway.start(host, public_port)
        self._phase("starting", "gateway up; preparing the engine")
        self._install_signals()

        try:
            if self.cluster is not None:
                if await self._ray_up(gateway):
                    await self._serve_ray_until_stopped(gateway)
                return self.exit_code
            if self.opts.runtime != "external":
                self._phase("starting", "resolving the model (a builtin model is generated on first use)")
                model_arg, model_dir = await asyncio.to_thread(
                    engine_args.resolve_model, p, paths.cache_home(), paths.REPO_ROOT)
                drafter_arg, drafter_dir = await asyncio.to_thread(
                    engine_args.resolve_drafter, p, paths.cache_home(), paths.REPO_ROOT)
                platform = self.opts.platform
                cfg = engine_args.build(p, platform=platform, uds=self.link.uds, engine_key=self.link.key,
                                        model_arg=model_arg, model_dir=model_dir, drafter_arg=drafter_arg)
                image = self.opts.image
                if self.opts.runtime == "docker" and image is None:
                    from . import images

                    image = images.resolve(p, platform)[2]
                spec = EngineSpec(deployment=self.name, server_args=cfg.server_args, env=cfg.env,
                                  platform=platform, socket_dir=self.socket_dir,
                                  log_path=engine_log, model_dir=model_dir,
                                  extra_dirs=(drafter_dir,) if drafter_dir else (),
                                  image=image, secret_env=cfg.secret_env)
                self.runtime = self._make_runtime()
                with open(engine_log, "a") as f:
                    f.write(f"[radiance] {cfg.redacted_command()}\n")
                self.handle = await asyncio.to_thread(self.runtime.start, spec)
                self.state.engine_ident = self.handle.ident
                self.state.save()
            self._phase("loading", "engine loading")
            await self._wait_engine(p.runtime.startup_timeout_s)
            self.gw_state.info["profile"] = {"name": p.name, "hash": p.fingerprint(),
                                             "features": p.features.enabled_names()}

            if self.opts.skip_gate:
                log.warning("GATE SKIPPED (--skip-gate): the endpoint is exposed without acceptance checks")
                self.gw_state.info["gate"] = {"skipped": True, "by": "--skip-gate"}
                self._phase("ready", "gate skipped by --skip-gate", ready=True)
            else:
                self._phase("gating", "running the gate")
                outcome = await verdict.run(p, engine_url, engine_key=self.link.key, context={
                    "profile": p.name, "profile_hash": p.fingerprint()},
                    progress=self.progress, patches=gateway.engine_report)
                self.state.gate_report = outcome.report_path or ""
                self.gw_state.info["gate"] = outcome.summary
                if outcome.passed:
                    self._phase("ready", "gate passed", ready=True)
                else:
                    self.exit_code = errors.GATE_FAILED
                    self._phase("unready", f"gate failed: {outcome.reason}")
                    if not self.opts.keep_serving_unready:
                        return self.exit_code
            await self._serve_until_stopped()
            return self.exit_code
        except asyncio.CancelledError:
            return self.exit_code
        except errors.LauncherError as exc:
            self._phase("failed", str(exc))
            raise
        finally:
            await gateway.drain()
            await gateway.stop()
            if self.handle is not None:
                self._phase("stopping", "stopping the engine")
                await asyncio.to_thread(self.runtime.stop, self.handle, max(drain, 10.0))
            engine_link.remove_socket_dir(self.socket_dir)
            if self.cluster is not None:
                self._phase("stopping", "deleting the Serve application (each replica stops its engine)")
                await asyncio.to_thread(self.cluster.teardown)
            if self.state is not None:
                self.state.exit_code = self.exit_code
                self._phase("stopped", self.gw_state.reason)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            log.info("%s received: stopping", signal.Signals(sig).name)
        self._stop.set()

    async def _serve_until_stopped(self) -> None:
        while not self._stop.is_set():
            if self.handle is not None and not await self._engine_alive():
                self.exit_code = errors.RUNTIME_ERROR
                self._phase("failed", "the engine exited unexpectedly")
                return
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass

    # -- runtime "ray" ---------------------------------------------------------------------
    async def _ray_replicas(self, gateway) -> dict:
        """Serve's view of the replicas, with what each replica said of itself, into /radiance/status."""
        from .runtime.ray_cluster import gate_failure

        r = await asyncio.to_thread(self.cluster.replicas)
        # Serve's message moves on while it retries a replica: the last gate failure seen stays on record.
        self._gate_failure = gate_failure(r["message"]) or self._gate_failure
        self.gw_state.info["replicas"] = {"target": self.opts.replicas, "serve_status": r["status"],
                                          "states": r["states"], "gate_failure": self._gate_failure,
                                          "answered_by": gateway.seen}
        return r

    async def _ray_up(self, gateway) -> bool:
        """Deploy the replicas and follow them through their gates: True once at least one serves and the
        rest have either passed or failed theirs."""
        from .runtime.ray_cluster import ready_count

        p, n = self.profile, self.opts.replicas
        self._phase("starting", f"joining the Ray cluster at {self.opts.ray_address}" if self.opts.ray_address
                    else "starting a local Ray cluster")
        self.state.ray_address = await asyncio.to_thread(self.cluster.connect)
        # Ray's core worker puts its own SIGTERM handler in (it logs, then dies): `radiance down` must
        # reach ours, which drains and deletes the application first.
        self._install_signals()
        self.state.replicas = n
        self.state.save()
        await asyncio.to_thread(self.cluster.deploy, p, self.opts.platform, n, gateway.drain_timeout)
        self.gw_state.info["profile"] = {"name": p.name, "hash": p.fingerprint(),
                                         "features": p.features.enabled_names()}
        # Each replica loads its engine and gates it inside its constructor, within the profile's startup
        # time; the gate's own time on top.
        deadline = time.monotonic() + p.runtime.startup_timeout_s + 600
        while not self._stop.is_set():
            r = await self._ray_replicas(gateway)
            running, failure = ready_count(r), self._gate_failure
            if r["status"] == "DEPLOY_FAILED":
                self.exit_code = errors.GATE_FAILED if failure else errors.RUNTIME_ERROR
                self._phase("unready" if failure else "failed",
                            f"no replica passed its gate: {failure or r['message'].splitlines()[0]}")
                return False
            if running == n or (running and failure):
                extra = f"; failed: {failure}" if running < n else ""
                self._phase("ready", f"{running}/{n} replicas passed their gate{extra}", ready=True)
                return True
            if time.monotonic() > deadline:
                raise errors.LauncherError(f"{running}/{n} replicas passed their gate within "
                                           f"{p.runtime.startup_timeout_s + 600:.0f}s — fix: see "
                                           f"`radiance logs {self.name}`")
            states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(r["states"].items()))
            self._phase("gating", f"{running}/{n} replicas passed their gate ({states})")
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        return False

    async def _serve_ray_until_stopped(self, gateway) -> None:
        """Ready while at least one replica serves; Serve replaces replicas whose engine exits."""
        from .runtime.ray_cluster import ready_count

        n = self.opts.replicas
        while not self._stop.is_set():
            try:
                running = ready_count(await self._ray_replicas(gateway))
            except Exception as exc:  # the cluster did not answer this time: say so, keep the last verdict
                log.warning("Ray did not answer for the replicas' states: %s", exc)
                running = None
            if running == 0 and self.gw_state.ready:
                self._phase("unready", f"0/{n} replicas serving: Serve is replacing them (each gates again)")
            elif running and (not self.gw_state.ready or not self.gw_state.reason.startswith(f"{running}/")):
                self._phase("ready", f"{running}/{n} replicas serving", ready=True)
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
