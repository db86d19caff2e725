"""The gateway's upstream side, in front of a fake engine on a Unix socket (an aiohttp app standing in
for vLLM's --uds + VLLM_API_KEY; the real engine is covered by tests/e2e/test_no_bypass.py):
the engine key goes upstream and the client's never does, request ids, the access log, and no
cap on concurrent upstream streams."""
import asyncio
import contextlib
import logging
import socket

import aiohttp
import pytest
from aiohttp import web

from launcher import engine_link
from launcher.engine_link import EngineLink
from launcher.gateway import Gateway, GatewayState

ENGINE_KEY = "engine-key-of-this-deployment"
CLIENT_KEY = "client-key"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeEngine:
    def __init__(self):
        self.seen_auth: list[str] = []
        self.seen_rid: list[str] = []
        self.in_flight = 0
        self.peak = 0
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        async def completions(request):
            self.seen_auth.append(request.headers.get("Authorization", ""))
            self.seen_rid.append(request.headers.get("X-Request-Id", ""))
            if request.headers.get("Authorization") != f"Bearer {ENGINE_KEY}":
                return web.json_response({"error": "Unauthorized"}, status=401)
            body = await request.json()
            if body.get("hold"):
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
                try:
                    await asyncio.wait_for(self.release.wait(), timeout=20)
                finally:
                    self.in_flight -= 1
            return web.json_response({"choices": [{"text": "ok"}]})

        async def metrics(request):
            return web.Response(text="vllm:num_requests_running 0\n")

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/metrics", metrics)
        return app


async def _serve_uds(app: web.Application, path: str) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, path).start()
    return runner


@contextlib.asynccontextmanager
async def _gateway_before(engine: FakeEngine, api_key: str | None = None):
    """A ready gateway on a free port in front of ``engine`` served on a private Unix socket: its port."""
    d = engine_link.private_socket_dir()
    sock = str(d / engine_link.SOCKET_NAME)
    runner = await _serve_uds(engine.app(), sock)
    state = GatewayState()
    state.set("ready", "test", ready=True)
    gw = Gateway(EngineLink(f"unix:{sock}", ENGINE_KEY), state, api_key=api_key, drain_timeout=2)
    port = _port()
    await gw.start("127.0.0.1", port)
    try:
        yield gw, port
    finally:
        await gw.drain()
        await gw.stop()
        await runner.cleanup()
        engine_link.remove_socket_dir(d)


def test_private_socket_dir_is_ours_only(tmp_path):
    d = engine_link.private_socket_dir()
    try:
        assert d.stat().st_mode & 0o777 == 0o700
        assert len(str(d / engine_link.SOCKET_NAME)) < 108
    finally:
        engine_link.remove_socket_dir(d)
    assert not d.exists()
    g = engine_link.private_socket_dir(group_access=True)
    try:
        assert g.stat().st_mode & 0o7777 == 0o2770
    finally:
        engine_link.remove_socket_dir(g)


def test_key_file_is_private(tmp_path):
    path = tmp_path / "run" / "engine.key"
    engine_link.write_key_file(path, "k1")
    engine_link.write_key_file(path, "k2")  # a restart replaces it atomically
    assert engine_link.read_key_file(path) == "k2"
    assert path.stat().st_mode & 0o777 == 0o600
    path.write_text("")
    with pytest.raises(ValueError):
        engine_link.read_key_file(path)


def test_engine_key_goes_upstream_and_the_clients_never(caplog):
    async def main():
        engine = FakeEngine()
        async with _gateway_before(engine, api_key=CLIENT_KEY) as (gw, port):
            base = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as s:
                auth = {"Authorization": f"Bearer {CLIENT_KEY}"}
                async with s.post(base + "/v1/completions?secret=xyz", json={}, headers=auth) as r:
                    assert r.status == 200
                    generated = r.headers["X-Request-Id"]
                async with s.post(base + "/v1/completions", json={},
                                  headers={**auth, "X-Request-Id": "req-42"}) as r:
                    assert r.status == 200 and r.headers["X-Request-Id"] == "req-42"
                # a caller's id that is not a plain token is replaced, not logged
                async with s.post(base + "/v1/completions", json={},
                                  headers={**auth, "X-Request-Id": "a b;forged"}) as r:
                    assert r.status == 200 and r.headers["X-Request-Id"] not in ("a b;forged", "")
                async with s.post(base + "/v1/completions", json={}) as r:
                    assert r.status == 401           # the gateway's own key check
                async with s.get(base + "/metrics", headers=auth) as r:
                    assert r.status == 200 and "num_requests_running" in await r.text()
                # the gateway's engine report reads the engine's /metrics over the socket too
                assert (await gw.engine_report()).patches == []
        assert engine.seen_auth == [f"Bearer {ENGINE_KEY}"] * 3
        assert engine.seen_rid[:2] == [generated, "req-42"]

    with caplog.at_level(logging.INFO, logger="radiance.gateway.access"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if r.name == "radiance.gateway.access"]
    assert any(ln.startswith("POST /v1/completions 200 ") and "id=req-42" in ln for ln in lines), lines
    assert any(ln.startswith("POST /v1/completions 401 ") for ln in lines), lines
    text = "\n".join(lines)
    for secret in (CLIENT_KEY, ENGINE_KEY, "secret=xyz", "forged"):
        assert secret not in text


def test_more_than_a_hundred_streams_reach_the_engine_at_once():
    """aiohttp's default pool (100 per session) would hold the 101st request until one finished."""
    n = 130

    async def main():
        engine = FakeEngine()
        async with _gateway_before(engine) as (_, port):
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:
                async def one():
                    async with s.post(f"http://127.0.0.1:{port}/v1/completions", json={"hold": True}) as r:
                        return r.status

                tasks = [asyncio.create_task(one()) for _ in range(n)]
                for _ in range(200):
                    if engine.in_flight >= n:
                        break
                    await asyncio.sleep(0.05)
                peak = engine.peak
                engine.release.set()
                statuses = await asyncio.gather(*tasks)
        return peak, statuses

    peak, statuses = asyncio.run(main())
    assert statuses == [200] * n
    assert peak == n
