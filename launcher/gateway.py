"""The readiness-gated proxy in front of the engine.

``/v1/health/live`` answers at once; ``/v1/health/ready`` is 503 (with the reason) until the
gate has passed; ``/v1/*`` and ``/metrics`` are proxied to the engine only once ready,
streaming both ways. The API key, when configured, is enforced here, and on shutdown
in-flight requests are drained before the engine is stopped.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import aiohttp
from aiohttp import web

from . import telemetry

log = logging.getLogger("radiance.gateway")

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


def _json_error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class Gateway:
    def __init__(self, upstream: str, state: GatewayState, *, api_key: str | None = None,
                 drain_timeout: float = 30.0, on_change: Callable[[], None] | None = None,
                 telemetry_dir: Path | None = None):
        self.upstream = upstream.rstrip("/")
        self.state = state
        self._api_key = api_key
        self.drain_timeout = drain_timeout
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.on_change = on_change
        self.telemetry_dir = telemetry_dir

    # -- app ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
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
        body = {"phase": self.state.phase, "ready": self.state.ready, "reason": self.state.reason,
                "since": self.state.since, "in_flight": self.in_flight, **self.state.info,
                "telemetry": telemetry.read_counters(self.telemetry_dir)}
        return web.json_response(body)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """The engine's /metrics with the plugin's counters appended."""
        refused = self._refuse(request)
        if refused is not None:
            return refused
        assert self._session is not None
        try:
            async with self._session.get(self.upstream + "/metrics") as upstream:
                text = await upstream.text()
                status, ctype = upstream.status, upstream.headers.get("Content-Type", "text/plain")
        except aiohttp.ClientError as exc:
            return _json_error(502, f"engine unreachable: {exc.__class__.__name__}", "bad_gateway")
        if status == 200:
            text += telemetry.render_prometheus(telemetry.read_counters(self.telemetry_dir))
        return web.Response(status=status, body=text.encode(), headers={"Content-Type": ctype})

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
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = self.upstream + request.rel_url.path_qs
        body = await request.read() if request.body_exists else None
        try:
            upstream = await self._session.request(request.method, url, headers=headers, data=body,
                                                   allow_redirects=False)
        except aiohttp.ClientError as exc:
            return _json_error(502, f"engine unreachable: {exc.__class__.__name__}", "bad_gateway")
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    response.headers[k] = v
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):
                # The client or the engine went away mid-stream; nothing more to send.
                return response
            await response.write_eof()
            return response

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()

    async def drain(self) -> bool:
        """Refuse new work, wait for in-flight requests; True if all finished in time."""
        self.state.set("draining", "shutting down")
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
