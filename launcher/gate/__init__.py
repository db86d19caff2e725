"""The gate: smoke, target (against a stock reference), acceptance (spec-decode counters) and GSM8K checks
before an endpoint is exposed.

    from launcher.gate import GateConfig, run_gate, EndpointUnreachable
    report = run_gate(profile.gate, "http://127.0.0.1:8001", model="tiny", context={...})
"""
from .client import EndpointUnreachable
from .config import GateConfig
from .result import CheckResult, GateReport
from .runner import run_gate, run_gate_async

__all__ = ["GateConfig", "GateReport", "CheckResult", "EndpointUnreachable", "run_gate", "run_gate_async"]
