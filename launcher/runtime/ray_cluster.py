"""Runtime "ray": the appliance as a Ray Serve application of N gated replicas.

The supervisor is a Ray driver: it joins the cluster at ``--address`` (or starts a local one that lives
as long as it does), deploys one Serve application named after the deployment with one deployment of
``RadianceReplica`` (launcher.runtime.ray_serve), and keeps the public side on this host: the same
gateway as every other runtime (API key, readiness, drain, access log), which reaches the replicas
through a Serve handle. Serve's HTTP proxy is not started, so there is no second door that skips the
key; placement, routing, health checks and replacement are Serve's own.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import deque
from typing import Any, Iterator

from .. import console, errors
from ..gateway import Gateway, GatewayState, Upstream, UpstreamError
from ..engine_link import EngineLink
from ..profile import Profile
from .base import Deployment, Phase

log = logging.getLogger("radiance.gateway")
sup_log = logging.getLogger("radiance.supervisor")

DEPLOYMENT = "radiance"           # the Serve deployment inside the application named after the deployment
REPLICA_HEADER = "X-Radiance-Replica"
# How long a request that has sent nothing to its client yet is tried again on the replicas Serve picks:
# a replica whose engine died is out of Serve's routing within a couple of health-check periods.
RETRY_WINDOW_S = 30.0
HEALTH_CHECK_PERIOD_S = 2.0
_GATE_FAILED = re.compile(r"GateFailed: (.+)")


def require_ray() -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise errors.UsageError("--runtime ray needs Ray Serve, which is not installed here — fix: "
                                "pip install 'radiance[ray]'") from None


class RayCluster:
    """One deployment's application on one Ray cluster; every method blocks (call it in a thread)."""

    def __init__(self, app: str, address: str | None):
        self.app = app
        self.address = address or None
        self.handle = None

    def connect(self) -> str:
        """Join the cluster (or start a local one); returns the address others can join it at."""
        import ray

        # "local": a new cluster owned by this process (never one that RAY_ADDRESS happens to name).
        try:
            ray.init(address=self.address or "local", logging_level=logging.WARNING, log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray cluster"
            raise errors.LauncherError(f"could not reach {where}: {str(exc).splitlines()[0] if str(exc) else exc!r} "
                                       "— fix: check --address (the head's host:port, `ray status` there)") from None
        return ray.get_runtime_context().gcs_address

    def deploy(self, profile: Profile, platform: str, replicas: int, drain_s: float) -> None:
        from ray import serve

        from . import ray_serve

        serve.start(proxy_location="Disabled")
        deployment = serve.deployment(
            ray_serve.RadianceReplica, name=DEPLOYMENT, num_replicas=replicas,
            ray_actor_options=ray_serve.actor_options(profile, platform),
            # vLLM batches: let Serve hand a replica as many requests as the engine schedules at once.
            max_ongoing_requests=int(profile.vllm_args.get("max-num-seqs") or 256),
            health_check_period_s=HEALTH_CHECK_PERIOD_S, health_check_timeout_s=30.0,
            graceful_shutdown_timeout_s=drain_s + 30.0)
        # Not blocking: a replica that fails its gate keeps the application from RUNNING for good, while
        # the others serve; the supervisor follows the replica states instead.
        serve._run(deployment.bind(profile.model_dump_json(), platform), name=self.app, route_prefix=None,
                   _blocking=False)
        self.handle = serve.get_deployment_handle(DEPLOYMENT, app_name=self.app)

    def replicas(self) -> dict[str, Any]:
        """Serve's view: the deployment's status, replicas per state, and its message (a gate failure's
        reason lands there)."""
        from ray import serve

        app = serve.status().applications.get(self.app)
        dep = app.deployments.get(DEPLOYMENT) if app is not None else None
        if dep is None:
            return {"status": "NOT_FOUND", "states": {}, "message": ""}
        return {"status": str(dep.status.value), "states": dict(dep.replica_states), "message": dep.message}

    def teardown(self) -> None:
        """Delete the application (Serve stops each replica gracefully: its engine goes with it), and Serve
        itself when nothing else runs on it; then leave the cluster (a local one ends with it)."""
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        try:
            if self.app in serve.status().applications:
                serve.delete(self.app)
            if not serve.status().applications:
                serve.shutdown()
        finally:
            ray.shutdown()

    def replica_logs(self) -> Iterator[tuple[str, str]]:
        """(replica actor, line) for every replica of the application that Ray still has a log of: the
        replica's own output with its engine's (the engine writes into the actor's stdout)."""
        from ray.util.state import get_log, list_actors

        actors = list_actors(filters=[("class_name", "=", f"ServeReplica:{self.app}:{DEPLOYMENT}")], limit=1000)
        for actor in actors:
            try:
                for chunk in get_log(actor_id=actor.actor_id, suffix="out", tail=-1):
                    for line in chunk.splitlines():
                        yield actor.actor_id[:8], line
            except Exception as exc:  # a node that is gone took its logs with it
                yield actor.actor_id[:8], f"[radiance] log not available: {exc}"


def gate_failure(message: str) -> str | None:
    """The reason of a replica's failed gate, out of Serve's deployment message (which carries the
    exception its constructor raised), or None when no gate failed."""
    m = _GATE_FAILED.search(message or "")
    return m.group(1).strip() if m else None


def ready_count(replicas: dict[str, Any]) -> int:
    return int(replicas.get("states", {}).get("RUNNING", 0))


class RayGateway(Gateway):
    """The gateway with Serve behind it: each request goes to a replica Serve picks, and goes again to
    another pick as long as nothing of it has reached the client (the replica's first item carries the
    first byte)."""

    def __init__(self, cluster: RayCluster, state: GatewayState, **kwargs):
        super().__init__(EngineLink(f"ray:{cluster.app}"), state, **kwargs)
        self.cluster = cluster
        self.seen: dict[str, dict] = {}   # replica -> what it said of itself in its last answer

    async def open_upstream(self, method: str, path_qs: str, headers: dict[str, str],
                            body: bytes | None) -> Upstream:
        if self.cluster.handle is None:
            raise UpstreamError("no replica deployed yet")
        deadline = time.monotonic() + RETRY_WINDOW_S
        attempt = 0
        while True:
            attempt += 1
            gen = self.cluster.handle.options(stream=True).forward.remote(method, path_qs, headers, body)
            try:
                first = await gen.__anext__()
                break
            except StopAsyncIteration:
                raise UpstreamError("the replica ended the answer before it began") from None
            except Exception as exc:  # nothing reached the client: another replica may answer
                if time.monotonic() > deadline:
                    raise UpstreamError(f"no replica answered within {RETRY_WINDOW_S:.0f}s "
                                        f"({attempt} attempts; last: {type(exc).__name__})") from None
                log.warning("%s %s: attempt %d failed before its first byte (%s); trying again",
                            method, path_qs.split("?")[0], attempt, type(exc).__name__)
                await asyncio.sleep(min(0.2 * attempt, 2.0))
        replica = first["replica"]
        self.seen[replica["replica"]] = {**replica, "last_seen": time.time()}

        async def pieces():
            if first["chunk"]:
                yield first["chunk"]
            try:
                async for piece in gen:
                    yield piece
            except Exception as exc:  # the replica or its engine went away mid-answer
                raise UpstreamError(f"replica broke off: {type(exc).__name__}") from None

        async def close() -> None:
            gen.cancel()

        return Upstream(first["status"], first["reason"], [*first["headers"], (REPLICA_HEADER, replica["replica"])],
                        pieces(), close)

    async def upstream_metrics(self) -> tuple[int, str, bytes]:
        """One replica's /metrics (Serve picks which; each replica reports its own engine)."""
        if self.cluster.handle is None:
            raise UpstreamError("no replica deployed yet")
        try:
            return await asyncio.wait_for(self.cluster.handle.metrics.remote(), timeout=15)
        except Exception as exc:
            raise UpstreamError(f"no replica answered: {type(exc).__name__}") from None


class RayRuntime:
    """The deployment as one Serve application: each replica gates itself (launcher.runtime.ray_serve), so
    ``ready`` follows the replicas through their gates and ``status`` counts those serving."""
    kind = "ray"
    takes = ("--replicas", "--address")
    refuses = {"--skip-gate": "a replica takes traffic only once its own gate passed",
               "--keep-serving-unready": "Serve replaces a replica that failed its gate, the others keep serving",
               "--image": "each replica runs vLLM in its node's Python"}
    hardware = "local"      # a local cluster runs on this machine: the local runtime's hardware verdict
    link = None             # each replica holds its own engine link on its node

    def __init__(self, name: str, replicas: int = 1, address: str | None = None) -> None:
        self.name = name
        self.replicas = replicas
        self.address = address or None     # None: a local cluster of ours
        self.cluster: RayCluster | None = None
        self._gateway: RayGateway | None = None
        self._gate_failure: str | None = None   # the last replica gate failure Serve reported

    @classmethod
    def from_profile(cls, profile: Profile, *, replicas: str | None = None, address: str | None = None,
                     **given) -> "RayRuntime":
        """``replicas``: --replicas as typed (else the profile's runtime.replicas); ``address``: --address
        on the command line (else the profile's runtime.address, else RAY_ADDRESS)."""
        if address is None:
            address = profile.runtime.address or os.environ.get("RAY_ADDRESS") or None
        n = profile.runtime.replicas
        if replicas is not None:
            try:
                n = int(replicas)
            except ValueError:
                n = 0
            if n < 1:
                raise errors.UsageError(f"--replicas {replicas!r}: expected a whole number >= 1 — fix: e.g. "
                                        "--replicas 2")
        if address is not None and not address.strip():
            raise errors.UsageError("--address is empty — fix: the Ray cluster's address (host:port of its GCS, "
                                    "or ray://host:10001), or leave it out for a local cluster")
        require_ray()
        return cls(profile.name, n, address)

    def elsewhere(self) -> str | None:
        return "the Ray cluster's nodes" if self.address else None

    def argv(self) -> tuple[str, ...]:
        return ("--replicas", str(self.replicas)) + (("--address", self.address) if self.address else ())

    @property
    def engine_url(self) -> str:
        return f"ray:{self.name}"

    def gateway(self, dep: Deployment, state: GatewayState, **kwargs) -> "RayGateway":
        # The gateway reaches the replicas through Serve.
        self.cluster = RayCluster(self.name, self.address)
        self._gateway = RayGateway(self.cluster, state, **kwargs)
        return self._gateway

    async def start(self, dep: Deployment) -> None:
        dep.phase("starting", f"joining the Ray cluster at {self.address}" if self.address
                  else "starting a local Ray cluster")
        dep.state.ray_address = await asyncio.to_thread(self.cluster.connect)
        # Ray's core worker puts its own SIGTERM handler in (it logs, then dies): `radiance down` must
        # reach ours, which drains and deletes the application first.
        dep.reclaim_signals()
        dep.state.replicas = self.replicas
        dep.state.save()
        await asyncio.to_thread(self.cluster.deploy, dep.profile, dep.platform, self.replicas,
                                self._gateway.drain_timeout)

    async def _replicas(self, dep: Deployment) -> dict:
        """Serve's view of the replicas, with what each replica said of itself, into /radiance/status."""
        r = await asyncio.to_thread(self.cluster.replicas)
        # Serve's message moves on while it retries a replica: the last gate failure seen stays on record.
        self._gate_failure = gate_failure(r["message"]) or self._gate_failure
        dep.gw_state.info["replicas"] = {"target": self.replicas, "serve_status": r["status"],
                                         "states": r["states"], "gate_failure": self._gate_failure,
                                         "answered_by": self._gateway.seen}
        return r

    async def ready(self, dep: Deployment) -> Phase | None:
        """Follow the replicas through their gates: ready once at least one serves and the rest have either
        passed or failed theirs."""
        n, budget = self.replicas, dep.profile.runtime.startup_timeout_s + 600
        # Each replica loads its engine and gates it inside its constructor, within the profile's startup
        # time; the gate's own time on top.
        deadline = time.monotonic() + budget
        while not dep.stopping.is_set():
            r = await self._replicas(dep)
            running, failure = ready_count(r), self._gate_failure
            if r["status"] == "DEPLOY_FAILED":
                return Phase("unready" if failure else "failed",
                             f"no replica passed its gate: {failure or r['message'].splitlines()[0]}",
                             exit_code=errors.GATE_FAILED if failure else errors.RUNTIME_ERROR)
            if running == n or (running and failure):
                extra = f"; failed: {failure}" if running < n else ""
                return Phase("ready", f"{running}/{n} replicas passed their gate{extra}", ready=True)
            if time.monotonic() > deadline:
                raise errors.LauncherError(f"{running}/{n} replicas passed their gate within {budget:.0f}s — "
                                           f"fix: see `radiance logs {dep.name}`")
            states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(r["states"].items()))
            dep.phase("gating", f"{running}/{n} replicas passed their gate ({states})")
            try:
                await asyncio.wait_for(dep.stopping.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
        return None

    async def status(self, dep: Deployment) -> Phase | None:
        """Ready while at least one replica serves; Serve replaces replicas whose engine exits."""
        n = self.replicas
        try:
            running = ready_count(await self._replicas(dep))
        except Exception as exc:  # the cluster did not answer this time: say so, keep the last verdict
            sup_log.warning("Ray did not answer for the replicas' states: %s", exc)
            return None
        if running == 0 and dep.gw_state.ready:
            return Phase("unready", f"0/{n} replicas serving: Serve is replacing them (each gates again)")
        if running and (not dep.gw_state.ready or not dep.gw_state.reason.startswith(f"{running}/")):
            return Phase("ready", f"{running}/{n} replicas serving", ready=True)
        return None

    async def stop(self, dep: Deployment, timeout: float) -> None:
        if self.cluster is not None:
            dep.phase("stopping", "deleting the Serve application (each replica stops its engine)")
            await asyncio.to_thread(self.cluster.teardown)

    @classmethod
    def logs(cls, st, follow: bool, tail: int | None) -> Iterator[str]:
        """Each replica's log (its own lines and its engine's), from whichever node it ran on, through Ray's
        state API; prefixed with the replica's actor id."""
        if follow:
            raise errors.UsageError("--follow is not available for --runtime ray — fix: run it again, or "
                                    "`ray logs actor --id ID --follow` for one replica")
        if not st.supervisor_alive() or not st.ray_address:
            raise errors.UsageError(f"{st.name} is not running: its replicas' logs lived on the Ray cluster — "
                                    "fix: `radiance logs --supervisor` for the launcher's side")
        cluster = RayCluster(st.name, st.ray_address)
        cluster.connect()
        lines = (f"[{actor}] {line}" for actor, line in cluster.replica_logs())
        return iter(deque(lines, maxlen=tail)) if tail is not None else lines

    @classmethod
    def leftovers(cls, st) -> int:
        if not st.ray_address:
            return 0
        try:  # Serve outlives a driver that was killed: its application (and each replica's engine) goes now
            cluster = RayCluster(st.name, st.ray_address)
            cluster.connect()
            before = cluster.replicas()["status"] != "NOT_FOUND"
            cluster.teardown()
            return int(before)
        except Exception as exc:  # a local cluster ended with its supervisor: nothing is left there
            console.warn(f"{st.name}: could not reach the Ray cluster at {st.ray_address}: {exc}")
            return 0
