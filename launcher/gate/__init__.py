"""The gate: smoke, target and speed (against a stock reference), acceptance (spec-decode counters) and
GSM8K checks before an endpoint is exposed.

    from launcher.gate import GateConfig, run_gate, EndpointUnreachable
    report = run_gate(profile.gate, "http://127.0.0.1:8001", model="tiny", context={...})

The names below are imported on first use (PEP 562), not with the package: the profile schema reads
``launcher.gate.config`` and must not load the runner (its HTTP client, GSM8K, the target check) into the
container entry point and every Ray replica that only parses a profile.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module of this package that defines it
_LAZY = {"EndpointUnreachable": "client", "GateConfig": "config", "CheckResult": "result",
         "GateReport": "result", "run_gate": "runner", "run_gate_async": "runner"}

__all__ = ["GateConfig", "GateReport", "CheckResult", "EndpointUnreachable", "run_gate", "run_gate_async"]

if TYPE_CHECKING:
    from .client import EndpointUnreachable
    from .config import GateConfig
    from .result import CheckResult, GateReport
    from .runner import run_gate, run_gate_async


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
