"""The gateway's own behaviour, in front of a small fake upstream (an aiohttp app standing in for
vLLM: the real engine is covered by tests/e2e). Readiness gating, API key, streaming, drain."""
import asyncio
import logging
import socket

import aiohttp
import pytest
from aiohttp import web

from launcher.gateway import Gateway, GatewayState


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _upstream(port: int, release: asyncio.Event):
    async def completions(request):
        body = await request.json()
        assert "authorization" not in {k.lower() for k in request.headers}, "the key must not reach the engine"
        if body.get("stream"):
            resp = web.StreamResponse()
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"data: {i}\n\n".encode())
                await asyncio.sleep(0.05)
            await resp.write(b"data: [DONE]\n\n")
            if body.get("linger"):   # the engine ends its body a moment after [DONE]
                await asyncio.sleep(0.3)
            return resp
        if body.get("slow"):
            await release.wait()
        return web.json_response({"choices": [{"text": "hi"}]})

    async def metrics(request):
        return web.Response(text="vllm:spec_decode_num_drafts_total 3\n")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def _ready_gateway(upstream_url: str, gw_port: int, **kwargs) -> Gateway:
    """A gateway whose engine has passed its gate, listening on gw_port."""
    state = GatewayState()
    state.set("ready", "ok", ready=True)
    gw = Gateway(upstream_url, state, **kwargs)
    await gw.start("127.0.0.1", gw_port)
    return gw


def run(coro):
    return asyncio.run(coro)


def test_ready_gates_proxy_and_streaming():
    async def main():
        up_port, gw_port = _port(), _port()
        release = asyncio.Event()
        upstream = await _upstream(up_port, release)
        state = GatewayState()
        gw = Gateway(f"http://127.0.0.1:{up_port}", state, drain_timeout=2)
        await gw.start("127.0.0.1", gw_port)
        base = f"http://127.0.0.1:{gw_port}"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(base + "/v1/health/live") as r:
                    assert r.status == 200
                async with s.get(base + "/v1/health/ready") as r:
                    assert r.status == 503 and (await r.json())["reason"] == "engine starting"
                async with s.post(base + "/v1/completions", json={}) as r:
                    assert r.status == 503
                async with s.get(base + "/metrics") as r:
                    assert r.status == 503
                state.set("ready", "gate passed", ready=True)
                async with s.get(base + "/v1/health/ready") as r:
                    assert r.status == 200
                async with s.post(base + "/v1/completions", json={"prompt": "x"}) as r:
                    assert r.status == 200 and (await r.json())["choices"][0]["text"] == "hi"
                async with s.get(base + "/metrics") as r:
                    assert "spec_decode" in await r.text()
                chunks = []
                async with s.post(base + "/v1/completions", json={"stream": True}) as r:
                    async for chunk in r.content.iter_any():
                        chunks.append(chunk)
                assert b"".join(chunks).endswith(b"data: [DONE]\n\n") and len(chunks) >= 2
        finally:
            await gw.stop()
            await upstream.cleanup()

    run(main())


def test_api_key_enforced_on_everything_but_health():
    async def main():
        up_port, gw_port = _port(), _port()
        upstream = await _upstream(up_port, asyncio.Event())
        gw = await _ready_gateway(f"http://127.0.0.1:{up_port}", gw_port, api_key="s3cret")
        base = f"http://127.0.0.1:{gw_port}"
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(base + "/v1/health/ready") as r:
                    assert r.status == 200
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    async with s.post(base + "/v1/completions", json={}, headers=headers) as r:
                        assert r.status == 401
                    async with s.get(base + "/radiance/status", headers=headers) as r:
                        assert r.status == 401
                async with s.post(base + "/v1/completions", json={},
                                  headers={"Authorization": "Bearer s3cret"}) as r:
                    assert r.status == 200
        finally:
            await gw.stop()
            await upstream.cleanup()

    run(main())


def test_drain_waits_for_in_flight_then_refuses_new():
    async def main():
        up_port, gw_port = _port(), _port()
        release = asyncio.Event()
        upstream = await _upstream(up_port, release)
        gw = await _ready_gateway(f"http://127.0.0.1:{up_port}", gw_port, drain_timeout=5)
        base = f"http://127.0.0.1:{gw_port}"
        try:
            async with aiohttp.ClientSession() as s:
                slow = asyncio.create_task(s.post(base + "/v1/completions", json={"slow": True}))
                while gw.in_flight == 0:
                    await asyncio.sleep(0.01)
                drain = asyncio.create_task(gw.drain())
                await asyncio.sleep(0.1)
                assert not drain.done()
                async with s.post(base + "/v1/completions", json={}) as r:
                    assert r.status == 503  # draining: no new work
                release.set()
                r = await slow
                assert r.status == 200 and (await r.json())["choices"][0]["text"] == "hi"
                assert await drain is True
        finally:
            await gw.stop()
            await upstream.cleanup()

    run(main())


def test_client_hanging_up_after_done_is_no_error(caplog):
    """A client that closes its connection on `data: [DONE]` (httpx without keep-alive does) before the
    gateway has sent the chunked terminator: the gateway logged a traceback per such request."""
    async def main():
        up_port, gw_port = _port(), _port()
        upstream = await _upstream(up_port, asyncio.Event())
        gw = await _ready_gateway(f"http://127.0.0.1:{up_port}", gw_port)
        try:
            async with aiohttp.ClientSession() as s:
                r = await s.post(f"http://127.0.0.1:{gw_port}/v1/completions", json={"stream": True, "linger": True})
                seen = b""
                while b"[DONE]" not in seen:
                    seen += await r.content.readany()
                r.close()   # hang up before the body's end
            for _ in range(100):
                if gw.in_flight == 0:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)   # past the upstream's linger: the gateway has tried to finish the body
            assert gw.in_flight == 0
        finally:
            await gw.stop()
            await upstream.cleanup()

    with caplog.at_level(logging.DEBUG):
        run(main())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


def test_engine_down_is_502_not_a_crash():
    async def main():
        gw_port = _port()
        gw = await _ready_gateway(f"http://127.0.0.1:{_port()}", gw_port)
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(f"http://127.0.0.1:{gw_port}/v1/completions", json={}) as r:
                    assert r.status == 502
        finally:
            await gw.stop()

    run(main())


def test_status_answers_with_the_gateways_own_state_while_the_engine_is_slow_to_report():
    """A Serve replica's /metrics can take seconds on a loaded host (CI: `radiance status` timed out and the
    replicas it was polling for went missing); /radiance/status waits for it only STATUS_ENGINE_WAIT_S."""
    from launcher.gateway import STATUS_ENGINE_WAIT_S

    async def main():
        up_port, gw_port = _port(), _port()
        release = asyncio.Event()

        async def slow_metrics(request):
            await release.wait()
            return web.Response(text="")

        app = web.Application()
        app.router.add_get("/metrics", slow_metrics)
        upstream = web.AppRunner(app)
        await upstream.setup()
        await web.TCPSite(upstream, "127.0.0.1", up_port).start()
        gw = await _ready_gateway(f"http://127.0.0.1:{up_port}", gw_port)
        gw.state.info["replicas"] = {"target": 3}
        try:
            async with aiohttp.ClientSession() as s:
                t0 = asyncio.get_running_loop().time()
                async with s.get(f"http://127.0.0.1:{gw_port}/radiance/status") as r:
                    body = await r.json()
                waited = asyncio.get_running_loop().time() - t0
            assert r.status == 200 and body["ready"] and body["replicas"] == {"target": 3}, body
            assert body["engine_report"] == f"no answer within {STATUS_ENGINE_WAIT_S:g} s", body
            assert body["patches"] == [] and waited < STATUS_ENGINE_WAIT_S + 2, waited
        finally:
            release.set()
            await gw.stop()
            await upstream.cleanup()

    run(main())
