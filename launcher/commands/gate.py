"""`radiance gate PROFILE --url URL`: the release gate against any running endpoint; `radiance gate [NAME]`:
against a deployment's gateway (with no name, the one that is running).

`radiance gate PROFILE --record-reference`: record the target check's stock reference on this machine
(the profile's engine started with its four features off, or the stock endpoint at --url), with the speed
check's stock decode throughput (gate.speed) in the same file."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .. import console, errors, paths
from ..state import DeploymentState
from ._common import JSON_OPT, check_vllm_args, load, pick_deployment, runnable_here


@click.command("gate")
@click.argument("profile_path", metavar="[PROFILE|NAME]", required=False, type=click.Path(dir_okay=False),
                envvar="RADIANCE_PROFILE")
@click.option("--url", default=None, envvar="RADIANCE_GATE_URL",
              help="Base URL of the OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000; env RADIANCE_GATE_URL). "
                   "Required, except with --record-reference.")
@click.option("--api-key-env", default=None,
              help="Name of the environment variable holding the endpoint's API key (default: the profile's).")
@click.option("--baseline-url", default=None,
              help="A second endpoint serving the same model with the features off: acceptance is compared "
                   "against it (needs gate.acceptance.baseline: true in the profile).")
@JSON_OPT
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a self-contained HTML page of the report here.")
@click.option("--reports-dir", type=click.Path(file_okay=False), default=None,
              help="Where the JSON report is saved (default: the state dir's reports/).")
@click.option("--record-reference", is_flag=True,
              help="Record the target check's stock reference instead of gating: starts PROFILE's engine with "
                   "its four features off on this machine (or measures the stock endpoint at --url) and "
                   "writes the state dir's references/<profile name>.json, which the gate then uses for this "
                   "profile before gate.target.reference; with gate.speed on, it holds stock's decode tok/s "
                   "too.")
@click.option("--output", "output", type=click.Path(dir_okay=False), default=None,
              help="With --record-reference: write the reference here instead.")
def command(profile_path: str, url: str | None, api_key_env: str | None, baseline_url: str | None, as_json: bool,
            html_path: str | None, reports_dir: str | None, record_reference: bool, output: str | None) -> None:
    """Run PROFILE's gate (smoke, target, speed, acceptance, GSM8K) against URL and exit 0 (pass), 3 (fail)
    or 5 (endpoint unreachable). The JSON report is saved either way. Given a deployment's NAME instead,
    or nothing (the deployment that is running), gate that deployment's gateway with its profile.

    With --record-reference, record the target check's reference from a stock run instead (exit 0)."""
    from ..gate import report as gate_report
    from ..gate import target
    from ..gate.runner import EndpointUnreachable, run_gate

    if not profile_path or (not Path(profile_path).exists() and DeploymentState.load(profile_path)):
        if record_reference:
            raise errors.UsageError("--record-reference needs PROFILE — fix: radiance gate PROFILE "
                                    "--record-reference")
        st = pick_deployment(profile_path, live_only=True)
        profile_path, url = st.profile_path, url or st.gateway_url
        api_key_env = api_key_env or st.api_key_env
    profile = load(profile_path)
    # The same profile errors as `check` and `up` (exit 2, one line), also where the engine runs elsewhere.
    from ..runtime import runtime_class

    check_vllm_args(profile, profile_path, "local" if record_reference and not url
                    else runtime_class(profile.runtime.kind).hardware)
    if output and not record_reference:
        raise errors.UsageError("--output is for --record-reference — fix: add --record-reference or drop --output")
    if record_reference:
        _record(profile_path, profile, url, api_key_env, output, as_json)
        return
    if not url:
        raise errors.UsageError("no endpoint to gate — fix: pass --url URL (or set RADIANCE_GATE_URL)")
    env_name = api_key_env or profile.server.api_key_env
    api_key = os.environ.get(env_name) if env_name else None
    if env_name and not api_key:
        raise errors.UsageError(f"{env_name} is not set — fix: export {env_name}=<key>")
    if profile.gate.acceptance.baseline and not baseline_url:
        raise errors.UsageError(f"{profile_path}: gate.acceptance.baseline is true — fix: pass --baseline-url "
                                "(an endpoint of the same model with the features off)")
    context = {"profile": profile.name, "profile_hash": profile.fingerprint(), "url": url.rstrip("/"),
               "drafter": profile.drafter.type, "features_enabled": profile.features.enabled_names()}
    if profile.runtime.platform != "auto":  # else the speed check goes by the platform its reference names
        context["platform"] = profile.runtime.platform
    try:
        report = run_gate(profile.gate, url.rstrip("/"), model=profile.served_name(), api_key=api_key,
                          progress=not as_json and sys.stderr.isatty(), context=context,
                          baseline_url=baseline_url.rstrip("/") if baseline_url else None,
                          identity=target.identity(profile))
    except EndpointUnreachable as exc:
        raise errors.LauncherError(f"endpoint {url} unreachable: {exc}", errors.UNREACHABLE) from None
    saved = gate_report.save(report, Path(reports_dir) if reports_dir else paths.reports_dir())
    if html_path:
        gate_report.write_html(report, Path(html_path))
    if as_json:
        sys.stdout.write(report.to_json() + "\n")
    else:
        gate_report.render_table(report, console.out)
        console.out.print(f"report: {saved}")
    sys.exit(errors.OK if report.passed else errors.GATE_FAILED)


def _record(profile_path: str, profile, url: str | None, api_key_env: str | None, output: str | None,
            as_json: bool) -> None:
    """Measure a stock run and write the reference; one line says where it went and what it holds."""
    import asyncio
    import json

    from ..gate import speed, target
    from ..gate.client import Client, EndpointUnreachable, RequestFailed
    from ..gate.runner import preflight

    cfg = profile.gate.target
    path = Path(output).expanduser() if output else target.recorded_path(profile.name)
    ident = target.identity(profile)
    model = profile.served_name()

    async def measure(address: str, key: str | None, source: str, platform: str | None) -> dict:
        await preflight(address, key)
        async with Client(address, api_key=key, timeout_s=cfg.timeout_s, retries=cfg.retries,
                          concurrency=1) as client:
            doc = await target.record(client, cfg, model=model, ident=ident, profile=profile.name,
                                      source=source, context={"profile_hash": profile.fingerprint()})
        if profile.gate.speed.enabled:
            doc["speed"] = await speed.record(address, key, profile.gate.speed, model=model, platform=platform)
        return doc

    async def from_stock_engine(platform: str) -> dict:
        from ..gate import stock

        log_path = target.recorded_path(profile.name).with_suffix(".engine.log")
        if not as_json:
            console.out.print(f"starting {profile.name}'s engine with its features off ({platform}; log "
                              f"{log_path})")
        async with stock.serve(profile, platform, log_path) as link:
            return await measure(link.address, link.key,
                                 f"stock engine started by radiance ({platform}, features off)", platform)

    try:
        if url:
            env_name = api_key_env or profile.server.api_key_env
            key = os.environ.get(env_name) if env_name else None
            if env_name and not key:
                raise errors.UsageError(f"{env_name} is not set — fix: export {env_name}=<key>")
            # The caller vouches that this endpoint serves the profile's model stock.
            platform = None if profile.runtime.platform == "auto" else profile.runtime.platform
            doc = asyncio.run(measure(url.rstrip("/"), key, f"endpoint {url.rstrip('/')} (stated stock)", platform))
        else:
            doc = asyncio.run(from_stock_engine(runnable_here(profile, profile_path).platform))
    except EndpointUnreachable as exc:
        raise errors.LauncherError(f"endpoint {url} unreachable: {exc}", errors.UNREACHABLE) from None
    except (RequestFailed, target.TargetDataError, ValueError) as exc:
        raise errors.LauncherError(f"recording the reference failed: {exc}") from None
    target.write_reference(doc, path)
    held, g = doc["held_text"], doc["greedy"]
    summary = {"reference": str(path), "profile": profile.name, "identity": ident, "source": doc["source"],
               "mean_nll": held["mean_nll"], "held_tokens": held["tokens"], "prompts": len(g["outputs"]),
               "max_tokens": g["max_tokens"], "decode_tok_s": (doc.get("speed") or {}).get("decode_tok_s")}
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        used = (f"the gate of {profile.name} uses it on this machine from now on" if not output else
                f"point the profile's gate.target.reference at it to use it")
        tok_s = summary["decode_tok_s"] or {}
        timed = ", stock decode " + ", ".join(f"{v:.1f} tok/s at B={b}" for b, v in tok_s.items()) if tok_s else ""
        console.out.print(f"reference: {path} (mean NLL {held['mean_nll']:.4f} over {held['tokens']} tokens, "
                          f"{len(g['outputs'])} greedy outputs of {g['max_tokens']} tokens{timed}); {used}")
