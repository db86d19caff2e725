"""What a runtime does: start the vLLM engine somewhere, report on it, stop it.

The gateway and the gate always run in the launcher's process on the host; a runtime only
owns the engine (a local subprocess, or a container). The engine serves on a Unix socket in
``spec.socket_dir`` (launcher.engine_link), never on a TCP port.
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
    platform: str                   # "cpu" | "rocm" | "cuda"
    log_path: Path | None           # engine stdout/stderr go here (host path); None: ours (a Ray replica's)
    model_dir: Path | None = None   # a local model directory (mounted read-only into containers)
    extra_dirs: tuple[Path, ...] = ()  # other local checkpoints (a drafter), mounted read-only too
    socket_dir: Path | None = None  # private directory holding the engine's socket (engine_link)
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
