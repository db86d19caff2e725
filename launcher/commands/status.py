"""`radiance status [NAME]`: deployments, their phase, gate and patches."""
from __future__ import annotations

import os
import time

import click
import httpx

from .. import console
from ..state import DeploymentState, all_deployments
from ._common import JSON_OPT


def live_status(st: DeploymentState) -> dict | None:
    """What the gateway itself says (patches, gate, telemetry); None when it does not answer."""
    headers = {}
    if st.api_key_env and os.environ.get(st.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[st.api_key_env]}"
    try:
        # The gateway bounds its own wait on the engine (STATUS_ENGINE_WAIT_S); this covers a loaded host.
        r = httpx.get(st.gateway_url + "/radiance/status", headers=headers, timeout=10.0)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def describe(st: DeploymentState) -> dict:
    alive = st.supervisor_alive()
    d = {"name": st.name, "phase": st.phase if alive or st.phase == "stopped" else "dead",
         "ready": st.ready and alive, "reason": st.reason, "gateway_url": st.gateway_url,
         "runtime": st.runtime, "profile": st.profile_path, "profile_hash": st.profile_hash,
         "uptime_s": round(time.time() - st.started_at, 1) if alive else 0, "gate_report": st.gate_report,
         "engine_log": st.engine_log}
    if alive:
        live = live_status(st)
        if live is not None:
            d["patches"] = live.get("patches", [])
            d["gate"] = live.get("gate")
            d["in_flight"] = live.get("in_flight")
            d["telemetry"] = live.get("telemetry")
            if live.get("replicas") is not None:
                d["replicas"] = live["replicas"]
        else:
            # Say so, rather than report a live deployment with no patches, gate or replicas.
            d["live"] = f"the gateway at {st.gateway_url} did not answer /radiance/status"
    return d


@click.command("status")
@click.argument("name", required=False)
@JSON_OPT
def command(name: str | None, as_json: bool) -> None:
    """Show deployments (or NAME): phase, readiness, gate result and applied/declined patches."""
    states = [s for s in all_deployments() if name is None or s.name == name]
    if name is not None and not states:
        from .. import errors

        raise errors.UsageError(f"no deployment named {name!r} — fix: `radiance status` lists them")
    data = [describe(s) for s in states]
    if as_json:
        console.print_json(data if name is None else data[0])
        return
    if not data:
        console.out.print("no deployments")
        return
    rows = [[d["name"], console.styled("ok" if d["ready"] else d["phase"]) + f" {d['phase']}",
             d["gateway_url"], d["runtime"], d["reason"]] for d in data]
    console.out.print(console.table("deployments", ["name", "state", "endpoint", "runtime", "reason"], rows))
    for d in data:
        if d.get("live"):
            console.out.print(f"{d['name']}: {d['live']}")
        if d.get("patches"):
            prow = [[p["feature"] or p["patch"], p["patch"], console.styled(p["status"]), p.get("reason", "")]
                    for p in d["patches"]]
            console.out.print(console.table(f"{d['name']}: patches", ["feature", "patch", "status", "reason"], prow))
        if d.get("gate"):
            g = d["gate"]
            grow = [[c["name"], console.styled(c["status"]), c.get("reason", "")] for c in g.get("checks", [])]
            if grow:
                console.out.print(console.table(f"{d['name']}: gate", ["check", "status", "reason"], grow))
        if d.get("replicas"):
            r = d["replicas"]
            states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(r["states"].items())) or "none"
            rrow = [[rid, info["node"][:12], str(info["served"])] for rid, info in sorted(r["answered_by"].items())]
            console.out.print(f"{d['name']}: {r['target']} replicas asked for; Serve: {r['serve_status']} ({states})"
                              + (f"; gate failed: {r['gate_failure']}" if r.get("gate_failure") else ""))
            if rrow:
                console.out.print(console.table(f"{d['name']}: replicas that answered", ["replica", "node",
                                                                                         "requests served"], rrow))
        if d.get("telemetry"):
            trow = [[k, str(v)] for k, v in sorted(d["telemetry"].items())]
            console.out.print(console.table(f"{d['name']}: draft telemetry", ["counter", "value"], trow))
