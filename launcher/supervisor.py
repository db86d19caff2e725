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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from radiance import envs

from . import errors, lifecycle, paths, procs
from .gateway import Gateway, GatewayState
from .profile import Profile
from .runtime.base import Phase, Runtime
from .state import DeploymentState, engine_stop_timeout

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
    platform: str
    skip_gate: bool = False
    keep_serving_unready: bool = False


class Supervisor:
    """Drives one runtime (launcher.runtime.base.Runtime) through the phases starting -> loading ->
    gating -> ready | unready | failed -> stopping -> stopped, with the gateway in front from the first."""

    def __init__(self, profile: Profile, profile_path: str, opts: UpOptions, runtime: Runtime,
                 progress: Callable[[str, str], None] | None = None):
        self.profile = profile
        self.profile_path = profile_path
        self.opts = opts
        self.platform = opts.platform
        self.runtime = runtime
        self.progress = progress or (lambda phase, detail: None)
        self.name = profile.name
        self.dir = paths.deployment_dir(self.name)
        self.gw_state = GatewayState()
        self.state: DeploymentState | None = None
        self.stopping = asyncio.Event()
        self.exit_code = errors.OK

    # -- what a runtime sees (launcher.runtime.base.Deployment) ----------------------------
    def phase(self, phase: str, reason: str = "", ready: bool = False) -> None:
        self.gw_state.set(phase, reason, ready)
        if self.state is not None:
            self.state.phase, self.state.reason, self.state.ready = phase, reason, ready
            self.state.save()
        self.progress(phase, reason)

    def reclaim_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    # -- helpers ---------------------------------------------------------------------------
    def _api_key(self) -> str | None:
        env_name = self.profile.server.api_key_env
        if not env_name:
            return None
        key = os.environ.get(env_name)
        if not key:
            raise errors.UsageError(f"server.api_key_env names {env_name}, which is not set — fix: "
                                    f"export {env_name}=<key> before `radiance up`")
        return key

    def _on_signal(self, sig: signal.Signals) -> None:
        if not self.stopping.is_set():
            log.info("%s received: stopping", signal.Signals(sig).name)
        self.stopping.set()

    def _moved_to(self, ph: Phase) -> None:
        if ph.exit_code is not None:
            self.exit_code = ph.exit_code
        self.phase(ph.phase, ph.reason, ready=ph.ready)

    # -- the run ---------------------------------------------------------------------------
    async def run(self) -> int:
        p, rt = self.profile, self.runtime
        host, public_port = p.server.host, p.server.port
        api_key = self._api_key()
        if port_in_use(host, public_port):
            raise errors.LauncherError(f"{host}:{public_port} is already in use — fix: stop what holds it "
                                       f"(`radiance status`) or set server.port in the profile")
        self.dir.mkdir(parents=True, exist_ok=True)
        engine_log = self.dir / "engine.log"
        if engine_log.exists():
            engine_log.replace(self.dir / "engine.log.1")

        drain = envs.get("RADIANCE_DRAIN_TIMEOUT")
        gateway = rt.gateway(self, self.gw_state, api_key=api_key, drain_timeout=drain)
        self.state = DeploymentState(
            name=self.name, profile_path=str(Path(self.profile_path).resolve()),
            profile_hash=p.fingerprint(), runtime=rt.kind,
            gateway_url=f"http://{host}:{public_port}", engine_url=rt.engine_url,
            supervisor_pid=os.getpid(), supervisor_started=procs.start_time(os.getpid()), engine_log=str(engine_log),
            supervisor_log=str(self.dir / "supervisor.log"), api_key_env=p.server.api_key_env,
            drain_timeout_s=drain)
        self.state.save()

        await gateway.start(host, public_port)
        self.phase("starting", "gateway up; preparing the engine")
        self.reclaim_signals()

        try:
            await rt.start(self)
            self.gw_state.info["profile"] = {"name": p.name, "hash": p.fingerprint(),
                                             "features": p.features.enabled_names()}
            decided = await rt.ready(self)
            if self.stopping.is_set():
                return self.exit_code
            if decided is None:
                decided = await self._gate(gateway)
            self._moved_to(decided)
            if not decided.ready and not self.opts.keep_serving_unready:
                return self.exit_code
            await self._serve_until_stopped()
            return self.exit_code
        except asyncio.CancelledError:
            return self.exit_code
        except errors.LauncherError as exc:
            self.phase("failed", str(exc))
            raise
        finally:
            await gateway.drain()
            await gateway.stop()
            await rt.stop(self, engine_stop_timeout(drain))
            if self.state is not None:
                self.state.exit_code = self.exit_code
                self.phase("stopped", self.gw_state.reason)

    async def _gate(self, gateway: Gateway) -> Phase:
        """The profile's gate against the runtime's engine: what the deployment becomes."""
        p, link = self.profile, self.runtime.link
        if self.opts.skip_gate:
            log.warning("GATE SKIPPED (--skip-gate): the endpoint is exposed without acceptance checks")
            self.gw_state.info["gate"] = {"skipped": True, "by": "--skip-gate"}
            return Phase("ready", "gate skipped by --skip-gate", ready=True)
        self.phase("gating", "running the gate")
        outcome = await lifecycle.gate(p, link, context={"platform": self.platform}, progress=self.progress,
                                       patches=gateway.engine_report)
        self.state.gate_report = outcome.report_path or ""
        self.gw_state.info["gate"] = outcome.summary
        if outcome.passed:
            return Phase("ready", "gate passed", ready=True)
        return Phase("unready", f"gate failed: {outcome.reason}", exit_code=errors.GATE_FAILED)

    async def _serve_until_stopped(self) -> None:
        while not self.stopping.is_set():
            change = await self.runtime.status(self)
            if change is not None:
                self._moved_to(change)
                if change.phase == "failed":
                    return
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
