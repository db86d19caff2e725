"""The readiness-gated proxy in front of the engine.

``/v1/health/live`` answers at once; ``/v1/health/ready`` is 503 (with the reason) until the
gate has passed; ``/v1/*`` and ``/metrics`` are proxied to the engine only once ready,
streaming both ways. The API key, when configured, is enforced here; upstream, the gateway reaches
the engine over its private link (launcher.engine_link: a Unix socket and the deployment's engine
key), which nothing else on the host can use. On shutdown in-flight requests are drained before
the engine is stopped. Every request gets one access-log line (method, path, status, duration,
request id) and never its query string or headers, where keys travel. ``/radiance/status`` is the
deployment's state with what the engine itself says of its patches and counters (its /metrics,
launcher.engine_report), so a local, a docker and a compose deployment show the same thing.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from . import engine_report
from .engine_link import EngineLink

log = logging.getLogger("radiance.gateway")
access_log = logging.getLogger("radiance.gateway.access")
REQUEST_ID = "X-Request-Id"
_RID_OK = re.compile(r"[A-Za-z0-9._:-]{1,128}")
RID_KEY = web.RequestKey("request_id", str)
# /radiance/status answers with the gateway's own state (phase, gate, replicas) even while the engine is slow
# to report its patches: under load a Serve replica's /metrics can take seconds to come back.
STATUS_ENGINE_WAIT_S = 2.0

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length", "authorization"}


@dataclass
class GatewayState:
    phase: str = "starting"          # starting | loading | gating | ready | unready | draining
    ready: bool = False
    reason: str = "engine starting"
    since: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)   # shown by /radiance/status

    def set(self, phase: str, reason: str = "", ready: bool = False) -> None:
        self.phase, self.reason, self.ready, self.since = phase, reason, ready, time.time()


class UpstreamError(Exception):
    """The engine (or, on Ray, every replica tried) could not be reached or broke off; the message is
    safe to show a client."""


@dataclass
class Upstream:
    """An engine's answer as the gateway relays it: status and headers, then the body as it arrives."""
    status: int
    reason: str | None
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]


def _json_error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class _AccessLogger(AbstractAccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %d %.1fms id=%s", request.method, request.path, response.status,
                         time * 1000.0, request.get(RID_KEY, "-"))


@web.middleware
async def _request_id(request: web.Request, handler):
    # A caller's id is kept when it is a plain token (it goes into logs); anything else gets a new one.
    rid = request.headers.get(REQUEST_ID, "")
    if not _RID_OK.fullmatch(rid):
        rid = uuid.uuid4().hex
    request[RID_KEY] = rid
    response = await handler(request)
    if not response.prepared:
        response.headers[REQUEST_ID] = rid
    return response


class Gateway:
    def __init__(self, upstream: EngineLink | str, state: GatewayState, *, api_key: str | None = None,
                 drain_timeout: float = 30.0, on_change: Callable[[], None] | None = None):
        self.link = upstream if isinstance(upstream, EngineLink) else EngineLink(upstream)
        self.upstream = self.link.base_url
        self.state = state
        self._api_key = api_key
        self.drain_timeout = drain_timeout
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.on_change = on_change

    # -- app ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_request_id])
        app.router.add_get("/v1/health/live", self.live)
        app.router.add_get("/v1/health/ready", self.ready)
        app.router.add_get("/radiance/status", self.status)
        app.router.add_route("*", "/v1/{tail:.*}", self.proxy)
        app.router.add_get("/metrics", self.metrics)
        return app

    def _authorized(self, request: web.Request) -> bool:
        if not self._api_key:
            return True
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        return hmac.compare_digest(token.encode(), self._api_key.encode())

    def _refuse(self, request: web.Request) -> web.Response | None:
        """Why an engine path may not be served now (key, readiness), or None."""
        if not self._authorized(request):
            return _json_error(401, "missing or wrong API key", "authentication_error")
        if not self.state.ready:
            return _json_error(503, f"endpoint not ready: {self.state.reason}", "unavailable")
        return None

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "live", "phase": self.state.phase})

    async def ready(self, request: web.Request) -> web.Response:
        body = {"status": "ready" if self.state.ready else "unready", "phase": self.state.phase,
                "reason": self.state.reason}
        return web.json_response(body, status=200 if self.state.ready else 503)

    async def status(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _json_error(401, "missing or wrong API key", "authentication_error")
        try:
            engine, answer = await asyncio.wait_for(self.engine_report(), STATUS_ENGINE_WAIT_S), "answered"
        except asyncio.TimeoutError:
            engine, answer = engine_report.EngineReport(), f"no answer within {STATUS_ENGINE_WAIT_S:g} s"
        body = {"phase": self.state.phase, "ready": self.state.ready, "reason": self.state.reason,
                "since": self.state.since, "in_flight": self.in_flight, **self.state.info,
                "engine_report": answer,
                # one row per feature patch (the report channel's and the drafter-load bracket's rows, which
                # belong to no feature, stay in patches_by_rank)
                "patches": [p for p in engine.patches if p["feature"]], "patches_by_rank": engine.ranks,
                "telemetry": engine.counters}
        return web.json_response(body)

    async def engine_report(self) -> engine_report.EngineReport:
        """What the engine's /metrics says of the patches (empty until its first step, or when it is
        unreachable)."""
        try:
            status, _, body = await self.upstream_metrics()
        except UpstreamError:
            return engine_report.EngineReport()
        if status != 200:
            return engine_report.EngineReport()
        try:
            return engine_report.parse(body.decode(errors="replace"))
        except ValueError:
            return engine_report.EngineReport()

    async def upstream_metrics(self) -> tuple[int, str, bytes]:
        """(status, content type, body) of the engine's /metrics; UpstreamError when it does not answer."""
        if self._session is None:
            raise UpstreamError("gateway not started")
        try:
            async with self._session.get(self.upstream + "/metrics", headers=self.link.headers(),
                                         timeout=aiohttp.ClientTimeout(total=10)) as upstream:
                return upstream.status, upstream.headers.get("Content-Type", "text/plain"), await upstream.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"engine unreachable: {exc.__class__.__name__}") from exc

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """The engine's /metrics (vLLM's and, through the plugin's report channel, radiance's)."""
        refused = self._refuse(request)
        if refused is not None:
            return refused
        try:
            status, ctype, body = await self.upstream_metrics()
        except UpstreamError as exc:
            return _json_error(502, str(exc), "bad_gateway")
        return web.Response(status=status, body=body, headers={"Content-Type": ctype})

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        self.in_flight += 1
        self._idle.clear()
        try:
            return await self._forward(request)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers[REQUEST_ID] = request[RID_KEY]
        body = await request.read() if request.body_exists else None
        try:
            upstream = await self.open_upstream(request.method, request.rel_url.path_qs, headers, body)
        except UpstreamError as exc:
            return _json_error(502, str(exc), "bad_gateway")
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers:
                if k.lower() not in HOP_BY_HOP:
                    response.headers[k] = v
            response.headers[REQUEST_ID] = request[RID_KEY]
            await response.prepare(request)
            try:
                async for chunk in upstream.body:
                    await response.write(chunk)
                # A streaming client may hang up as soon as it reads `data: [DONE]`, before the chunked
                # body's terminator goes out: that is a finished request, not an error to log.
                await response.write_eof()
            except (aiohttp.ClientError, ConnectionResetError, UpstreamError):
                # The client or the engine went away mid-stream; nothing more to send.
                pass
            return response
        finally:
            await upstream.close()

    async def open_upstream(self, method: str, path_qs: str, headers: dict[str, str],
                            body: bytes | None) -> "Upstream":
        """Send the request to the engine; returns once its status and headers are in."""
        assert self._session is not None
        headers = {**headers, **self.link.headers()}   # the client's key stops here; the engine gets its own
        try:
            upstream = await self._session.request(method, self.upstream + path_qs, headers=headers, data=body,
                                                   allow_redirects=False)
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"engine unreachable: {exc.__class__.__name__}") from exc

        async def release() -> None:
            upstream.release()

        return Upstream(upstream.status, upstream.reason, list(upstream.headers.items()),
                        upstream.content.iter_any(), release)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False,
                                              connector=self.link.aiohttp_connector())
        self._runner = web.AppRunner(self.app(), access_log=access_log, access_log_class=_AccessLogger,
                                     handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()

    async def drain(self) -> bool:
        """Refuse new work, wait for in-flight requests; True if all finished in time."""
        self.state.set("draining", "shutting down")
        log.info("draining: %d request(s) in flight; refusing new work", self.in_flight)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=self.drain_timeout)
            return True
        except asyncio.TimeoutError:
            log.warning("drain timeout after %.0fs with %d requests in flight", self.drain_timeout,
                        self.in_flight)
            return False

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
