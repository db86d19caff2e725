"""`radiance status --json` and the gateway's /radiance/status say what the engine's report says: a patch
that runs stock (declined at load, partial per step, latched off on a rank) is shown as such, with the
step counts beside dynamic-draft."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import threading

import httpx
from aiohttp import web
from click.testing import CliRunner

from launcher.cli import cli
from launcher.gateway import Gateway, GatewayState
from launcher.state import DeploymentState

# What the engine's /metrics carries for a TP=2 engine whose target is not Qwen3-Next, with no drafter for
# w4-drafter, dynamic-draft running some steps stock, and int4-head latched off by a fault on rank 1.
METRICS = "".join(
    f'radiance:patch_status{{engine="0",feature="{f}",model_name="m",patch="{p}",rank="{r}",reason="{why}",'
    f'status="{st}"}} 1.0\n'
    for r in "01" for f, p, st, why in (
        ("fp8_stream", "fp8_stream.decoder_contract", "declined",
         "the target (LlamaForCausalLM) has no Qwen3-Next decoder core: nothing streams, stock contract"),
        ("w4_drafter", "w4_drafter.linears", "declined", "no drafter: nothing to convert"),
        ("dynamic_draft", "dynamic_draft.proposer", "partial",
         "stock MTP for steps where fewer than two draft slots are scheduled"),
        ("int4_head", "int4_head.lm_head", "failed-at-runtime",
         "fault on TP rank 1 at step 3: RuntimeError: x" if r == "1" else
         "TP rank(s) 1 faulted at step 3; turned off on every rank together"),
        ("", "report.worker", "applied", ""),
    )) + ('radiance:draft_steps_total{engine="0",model_name="m"} 12.0\n'
          'radiance:draft_fallback_steps_total{engine="0",model_name="m"} 4.0\n')


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_in_thread(up_port: int, gw_port: int):
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict = {}

    async def main():
        async def metrics(request):
            return web.Response(text=METRICS)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", up_port).start()
        state = GatewayState()
        state.set("ready", "gate passed", ready=True)
        gw = Gateway(f"http://127.0.0.1:{up_port}", state)
        await gw.start("127.0.0.1", gw_port)
        holder["stop"] = asyncio.Event()
        started.set()
        await holder["stop"].wait()
        await gw.stop()
        await runner.cleanup()

    t = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    t.start()
    assert started.wait(10)

    def stop():
        loop.call_soon_threadsafe(holder["stop"].set)
        t.join(10)

    return stop


def test_status_json_names_every_stock_case(isolated_home):
    up_port, gw_port = _port(), _port()
    stop = _serve_in_thread(up_port, gw_port)
    try:
        gw = f"http://127.0.0.1:{gw_port}"
        live = httpx.get(gw + "/radiance/status", timeout=5).json()
        DeploymentState(name="truth", profile_path="p.yaml", profile_hash="h", runtime="local", gateway_url=gw,
                        engine_url=f"http://127.0.0.1:{up_port}", supervisor_pid=os.getpid(), phase="ready",
                        ready=True).save()
        res = CliRunner().invoke(cli, ["status", "truth", "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
    finally:
        stop()
    assert out["patches"] == live["patches"]
    by = {p["feature"]: p for p in out["patches"]}
    assert set(by) == {"fp8_stream", "w4_drafter", "dynamic_draft", "int4_head"}  # feature rows only
    assert by["fp8_stream"]["status"] == "declined" and "LlamaForCausalLM" in by["fp8_stream"]["reason"]
    assert by["w4_drafter"] == {"feature": "w4_drafter", "patch": "w4_drafter.linears", "status": "declined",
                                "reason": "no drafter: nothing to convert", "ranks": ["0", "1"]}
    dd = by["dynamic_draft"]
    assert dd["status"] == "partial" and dd["steps"] == {"patch": 12, "stock": 4}
    assert dd["reason"].endswith("; 12 steps drafted by dynamic-draft, 4 ran stock MTP")
    assert by["int4_head"]["status"] == "failed-at-runtime" and "rank 1: fault on TP rank 1" in \
        by["int4_head"]["reason"]
    assert out["telemetry"]["draft_fallback_steps"] == 4
