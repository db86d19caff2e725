"""`radiance gateway PROFILE --engine-url URL`: gate and expose an engine started elsewhere
(compose's engine service); the same gateway and gate as `radiance up`."""
from __future__ import annotations

import sys

import click

from ..engine_link import read_key_file
from ..errors import UsageError
from ..runtime.external import ExternalRuntime
from ..supervisor import UpOptions
from ._common import PROFILE_ARG, check_knobs, load
from .up import run_foreground


@click.command("gateway")
@PROFILE_ARG
@click.option("--engine-url", required=True, envvar="RADIANCE_ENGINE_URL",
              help="Where the running vLLM engine listens: http://host:port or unix:/path (env "
                   "RADIANCE_ENGINE_URL).")
@click.option("--engine-key-file", type=click.Path(dir_okay=False), default=None,
              envvar="RADIANCE_ENGINE_KEY_FILE",
              help="File with the engine's key (its VLLM_API_KEY), sent upstream by the gateway and the gate "
                   "(env RADIANCE_ENGINE_KEY_FILE).")
@click.option("--host", default=None, help="Listen address (default: the profile's server.host).")
@click.option("--port", type=int, default=None, envvar="RADIANCE_PORT", help="Listen port (env RADIANCE_PORT).")
@click.option("--skip-gate", is_flag=True, help="Expose without running the gate (recorded, loud).")
@click.option("--keep-serving-unready", is_flag=True, help="Stay up (ready 503) when the gate fails.")
def command(profile_path: str, engine_url: str, engine_key_file: str | None, host: str | None,
            port: int | None, skip_gate: bool, keep_serving_unready: bool) -> None:
    """Wait for the engine at ENGINE_URL, run PROFILE's gate, then proxy it (ready only after the gate)."""
    profile = load(profile_path)
    check_knobs()
    engine_key = None
    if engine_key_file:
        try:
            engine_key = read_key_file(engine_key_file)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--engine-key-file {engine_key_file}: {exc} — fix: point it at the file the "
                             "engine wrote (radiance-engine --key-file)") from None
    server = profile.server.model_copy(update={k: v for k, v in (("host", host), ("port", port)) if v is not None})
    profile = profile.model_copy(update={"server": server})
    opts = UpOptions(platform="external", skip_gate=skip_gate, keep_serving_unready=keep_serving_unready)
    runtime = ExternalRuntime(engine_url, engine_key)
    sys.exit(run_foreground(profile, profile_path, opts, runtime, quiet=True, gate_only=False))
