"""The gate as `radiance up` uses it: run the profile's checks against the engine, save the
report, and hand back pass/fail with a one-line reason."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

from radiance import envs

from .. import paths
from ..profile import Profile


@dataclass
class GateOutcome:
    passed: bool
    reason: str
    report_path: str | None = None
    summary: dict = field(default_factory=dict)


def summarize(report) -> dict:
    return {"passed": report.passed, "reason": report.reason,
            "checks": [{"name": c.name, "status": c.status, "reason": c.reason} for c in report.checks]}


async def run(profile: Profile, engine_url: str, *, context: dict, engine_key: str | None = None,
              progress: Callable[[str, str], None] | None = None,
              patches: Callable[[], Awaitable] | None = None) -> GateOutcome:
    """``patches``: what the engine says of its patches (read after the gate's traffic, the first the
    engine serves: its report rides its first steps), recorded in the report's context."""
    from . import report as gate_report
    from . import target
    from .runner import run_gate_async

    if envs.get("RADIANCE_GATE_FORCE_FAIL"):
        reason = "RADIANCE_GATE_FORCE_FAIL is set here: failed without running the checks"
        return GateOutcome(passed=False, reason=reason,
                           summary={"passed": False, "reason": reason, "forced": True, "checks": []})
    context = {"drafter": profile.drafter.type, "features_enabled": profile.features.enabled_names(), **context}
    # The gate talks to the engine directly (its socket, its key): the gateway proxies nothing until the
    # gate has passed.
    report = await run_gate_async(profile.gate, engine_url, model=profile.served_name(), api_key=engine_key,
                                  progress=False, context=context, identity=target.identity(profile))
    if patches is not None:
        report.context["patches"] = (await patches()).patches
    path = gate_report.save(report, paths.reports_dir())
    return GateOutcome(passed=report.passed, reason=report.reason or "", report_path=str(path),
                       summary=summarize(report))
