"""What a runtime does: start the vLLM engine somewhere, report on it, stop it.

The gateway and the gate always run in the launcher's process on the host; a runtime only
owns the engine (a local subprocess, or a container). Its address is ``spec.host:spec.port``
as seen from the host.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol


@dataclass
class EngineSpec:
    deployment: str                 # name of the deployment (profile name unless overridden)
    server_args: list[str]          # arguments after `python -m vllm.entrypoints.openai.api_server`
    env: dict[str, str]             # RADIANCE_* knobs and VLLM_* settings for the engine processes
    host: str                       # where the engine listens, as seen from the host
    port: int                       # internal engine port (never the public one)
    platform: str                   # "cpu" | "rocm" | "cuda"
    log_path: Path                  # engine stdout/stderr go here (host path)
    report_dir: Path                # RADIANCE_REPORT_DIR on the host (mounted into containers)
    model_dir: Path | None = None   # a local model directory (mounted read-only into containers)
    extra_dirs: tuple[Path, ...] = ()  # other local checkpoints (a drafter), mounted read-only too
    image: str | None = None        # docker runtime: the image to run
    secret_env: dict[str, str] = field(default_factory=dict)  # HF_TOKEN etc.: passed, never logged


@dataclass
class EngineHandle:
    runtime: str                    # "local" | "docker"
    ident: str                      # pid (local) or container id (docker)
    spec: EngineSpec


class Runtime(Protocol):
    name: str

    def start(self, spec: EngineSpec) -> EngineHandle:
        """Start the engine and return at once (the caller waits for readiness over HTTP)."""

    def alive(self, handle: EngineHandle) -> bool: ...

    def stop(self, handle: EngineHandle, timeout: float) -> None:
        """SIGTERM, wait up to timeout, then kill; leaves nothing running."""

    def logs(self, handle: EngineHandle, follow: bool = False) -> Iterator[str]: ...
