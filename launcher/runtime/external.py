"""Runtime "external": an engine someone else runs (compose's engine service), reached at its URL.

`radiance gateway PROFILE --engine-url URL` gates and exposes it; nothing is started or stopped here.
"""
from __future__ import annotations

from ..engine_link import EngineLink
from .base import Deployment, LinkedRuntime


class ExternalRuntime(LinkedRuntime):
    kind = "external"
    hardware = "external"

    def __init__(self, engine_url: str, engine_key: str | None = None) -> None:
        super().__init__()
        self.url = engine_url
        self.key = engine_key           # the key the engine wants (its VLLM_API_KEY), if any

    @classmethod
    def from_profile(cls, profile, *, engine_url: str, engine_key: str | None = None,
                     **given) -> "ExternalRuntime":
        return cls(engine_url, engine_key)

    def open_link(self, dep: Deployment) -> EngineLink:
        return EngineLink(self.url.rstrip("/"), self.key)

    async def start(self, dep: Deployment) -> None:
        return None

    async def stop(self, dep: Deployment, timeout: float) -> None:
        return None
