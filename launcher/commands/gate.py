"""`radiance gate PROFILE --url URL`: the release gate against any running endpoint."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from .. import console, errors, paths
from ._common import JSON_OPT, PROFILE_ARG, load


@click.command("gate")
@PROFILE_ARG
@click.option("--url", required=True, envvar="RADIANCE_GATE_URL",
              help="Base URL of the OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000; env RADIANCE_GATE_URL).")
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
def command(profile_path: str, url: str, api_key_env: str | None, baseline_url: str | None, as_json: bool,
            html_path: str | None, reports_dir: str | None) -> None:
    """Run PROFILE's gate (smoke, acceptance, GSM8K) against URL and exit 0 (pass), 3 (fail)
    or 5 (endpoint unreachable). The JSON report is saved either way."""
    from ..gate import report as gate_report
    from ..gate.runner import EndpointUnreachable, run_gate

    profile = load(profile_path)
    env_name = api_key_env or profile.server.api_key_env
    api_key = os.environ.get(env_name) if env_name else None
    if env_name and not api_key:
        raise errors.UsageError(f"{env_name} is not set — fix: export {env_name}=<key>")
    if profile.gate.acceptance.baseline and not baseline_url:
        raise errors.UsageError(f"{profile_path}: gate.acceptance.baseline is true — fix: pass --baseline-url "
                                "(an endpoint of the same model with the features off)")
    context = {"profile": profile.name, "profile_hash": profile.fingerprint(), "url": url.rstrip("/"),
               "drafter": profile.drafter.type, "features_enabled": profile.features.enabled_names()}
    try:
        report = run_gate(profile.gate, url.rstrip("/"), model=profile.served_name(), api_key=api_key,
                          progress=not as_json and sys.stderr.isatty(), context=context,
                          baseline_url=baseline_url.rstrip("/") if baseline_url else None)
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
