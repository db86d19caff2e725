"""One RADIANCE appliance inside a Ray Serve replica (imported by the replica actor, on its node).

The replica is what `radiance up` is on one host, minus the public gateway: it starts vLLM with the
plugin as a subprocess on a private Unix socket with a key of its own (launcher.engine_args.from_profile,
launcher.runtime.local's LocalEngine, launcher.engine_link), waits for it, and runs the profile's gate against it, all in its constructor.
Serve routes to a replica only once its constructor has returned, so a replica whose gate fails raises
instead and never takes a request (Serve retries it, on whatever node has room). Afterwards
``check_health`` is the engine staying up: an engine that exits makes Serve replace the replica.

Requests come from the RADIANCE gateway through a Serve handle (launcher.runtime.ray_cluster): the
first item a replica yields carries the status, headers, the first piece of the body and who answered,
so the gateway can send the request to another replica as long as nothing has reached its client.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator

import aiohttp

from .. import engine_link, lifecycle, procs
from ..profile import Profile
from .local import LocalEngine

class GateFailed(RuntimeError):
    """This replica's gate failed: Serve must not route to it."""


class EngineUnavailable(RuntimeError):
    """The replica's engine did not answer before the first byte; another replica may."""


class RadianceReplica:
    async def __init__(self, profile_json: str, platform: str):
        import ray
        from ray import serve

        self.started: lifecycle.StartedEngine | None = None
        self.door: lifecycle.Door | None = None
        self.session: aiohttp.ClientSession | None = None
        self.served = 0
        profile = Profile.model_validate_json(profile_json)
        self.ident = {"replica": serve.get_replica_context().replica_id.unique_id,
                      "node": ray.get_runtime_context().get_node_id()}
        self.door = lifecycle.open_door()
        self.link = self.door.link
        # The engine writes into this actor's own log (Ray keeps it per worker on the node:
        # `radiance logs` reads it through Ray's state API).
        self.started = await lifecycle.start(
            profile, platform=platform, engine=LocalEngine(subreaper=False), door=self.door,
            deployment=profile.name, log_path=None, prepare=lambda cfg: _same_plugin(cfg.env),
            announce=lambda command: print(f"[radiance] replica {self.ident['replica']}: {command}", flush=True))
        engine_pid = int(self.started.handle.ident)
        # Serve kills a replica it gives up on (one still loading when the application is deleted): the
        # engine's whole process group goes with it.
        procs.leash(engine_pid, env={**os.environ, **{k: v for k, v in self.started.config.env.items()
                                                      if k == "PYTHONPATH"}})
        self.ident["engine_pid"] = engine_pid
        try:
            await engine_link.wait_ready(self.link, profile.runtime.startup_timeout_s, alive=self.started.alive,
                                         what=f"replica {self.ident['replica']}'s engine",
                                         see="the replica's log")
        except Exception:
            self._stop_engine()
            raise
        outcome = await lifecycle.gate(profile, self.link, context={"replica": self.ident["replica"],
                                                                    "node": self.ident["node"]})
        print(f"[radiance] replica {self.ident['replica']}: gate {'passed' if outcome.passed else 'FAILED'}: "
              f"{outcome.reason} (report {outcome.report_path})", flush=True)
        if not outcome.passed:
            self._stop_engine()
            raise GateFailed(f"gate failed on replica {self.ident['replica']}: {outcome.reason}")
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                             auto_decompress=False, connector=self.link.aiohttp_connector())

    async def check_health(self) -> None:
        if self.started is None or not await self.started.alive():
            raise RuntimeError(f"replica {self.ident['replica']}: its engine exited")

    async def forward(self, method: str, path_qs: str, headers: dict[str, str],
                      body: bytes | None) -> AsyncIterator[dict | bytes]:
        """The request against this replica's engine: first a dict (status, reason, headers, replica,
        chunk: the first piece of the body), then the rest of the body piece by piece. Anything that goes
        wrong before the first item raises, so the caller may try another replica."""
        assert self.session is not None
        headers = {**headers, **self.link.headers()}
        try:
            upstream = await self.session.request(method, self.link.base_url + path_qs, headers=headers,
                                                  data=body, allow_redirects=False)
        except aiohttp.ClientError as exc:
            raise EngineUnavailable(f"engine unreachable: {exc.__class__.__name__}") from None
        async with upstream:
            pieces = upstream.content.iter_any()
            try:
                first = await pieces.__anext__()
            except StopAsyncIteration:
                first = b""
            except aiohttp.ClientError as exc:
                raise EngineUnavailable(f"engine broke off before answering: {exc.__class__.__name__}") from None
            self.served += 1
            yield {"status": upstream.status, "reason": upstream.reason, "headers": list(upstream.headers.items()),
                   "replica": {**self.ident, "served": self.served}, "chunk": first}
            async for piece in pieces:
                yield piece

    async def metrics(self) -> tuple[int, str, bytes]:
        """The engine's /metrics (vLLM's and the plugin's report channel), as the gateway relays it."""
        assert self.session is not None
        async with self.session.get(self.link.base_url + "/metrics", headers=self.link.headers(),
                                    timeout=aiohttp.ClientTimeout(total=10)) as r:
            return r.status, r.headers.get("Content-Type", "text/plain"), await r.read()

    def _stop_engine(self) -> None:
        if getattr(self, "started", None) is not None:
            self.started.stop_blocking(10.0)
            self.started = None
        if getattr(self, "door", None) is not None:
            self.door.close()
            self.door = None

    def __del__(self):
        # Serve calls this on a graceful stop (down, scale-in, a failed health check); Python does too
        # for a constructor that raised. The engine's whole process group goes with the replica.
        self._stop_engine()


def actor_options(profile: Profile, platform: str) -> dict:
    """What one replica reserves on its node: the profile's TP x PP devices (vLLM runs its TP workers as
    local processes of the engine, so one actor holds them all and a replica never spans nodes)."""
    devices = profile.parallel.tp * profile.parallel.pp
    if platform == "cpu":
        return {"num_cpus": devices}
    return {"num_cpus": 1, "num_gpus": devices}



def _same_plugin(env: dict[str, str]) -> None:
    """The engine imports the radiance this replica runs: Ray starts workers in a directory of its own,
    where a source checkout the replica found on the driver's path is not importable by name."""
    import site
    import sys

    from radiance import envs

    root = str(Path(envs.__file__).resolve().parent.parent)
    installed = {str(Path(p).resolve()) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if root not in installed and root in {str(Path(p or ".").resolve()) for p in sys.path}:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
