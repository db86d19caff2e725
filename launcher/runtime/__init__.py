"""The runtimes, by the name a profile's ``runtime.kind`` (or `radiance up --runtime`) gives them.

Each is a module of this package with one class implementing ``base.Runtime``; imported on first use,
so a runtime's dependencies (the docker SDK, Ray) are needed only where it runs.
"""
from __future__ import annotations

import importlib

RUNTIMES = {
    "local": "local:LocalRuntime",
    "docker": "docker:DockerRuntime",
    "ray": "ray_cluster:RayRuntime",
    "external": "external:ExternalRuntime",
}


def runtime_class(kind: str):
    """The class implementing runtime ``kind`` (launcher.runtime.base.Runtime)."""
    module, _, name = RUNTIMES[kind].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
