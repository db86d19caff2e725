"""What a gate run produces: one result per check, and the report that carries them."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skipped", "error"]
STATUSES: tuple[str, ...] = ("pass", "fail", "skipped", "error")
SCHEMA_VERSION = 1


@dataclass
class CheckResult:
    name: str
    status: Status
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @property
    def blocking(self) -> bool:
        """A check that stops the endpoint from being exposed."""
        return self.status in ("fail", "error")


@dataclass
class GateReport:
    checks: list[CheckResult]
    model: str
    endpoint: str  # redacted: no credentials, no query string
    started_at: str  # ISO 8601, UTC
    finished_at: str
    duration_s: float
    context: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    served_models: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    @property
    def passed(self) -> bool:
        return not any(c.blocking for c in self.checks)

    @property
    def reason(self) -> str:
        """One line: the first blocking check and why, or a summary when all passed."""
        for c in self.checks:
            if c.blocking:
                return f"{c.name} {c.status}: {c.reason}" if c.reason else f"{c.name} {c.status}"
        ran = [c.name for c in self.checks if c.status == "pass"]
        return f"passed: {', '.join(ran)}" if ran else "passed (no check ran)"

    @property
    def timings(self) -> dict[str, float]:
        return {"total_s": self.duration_s, **{f"{c.name}_s": c.duration_s for c in self.checks}}

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # Derived fields are written out for readers of the JSON; from_dict ignores them.
        d = {"passed": self.passed, "reason": self.reason, "timings": self.timings, **d}
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, allow_nan=False,
                          default=_json_default)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GateReport":
        d = dict(d)
        d.pop("passed", None)
        d.pop("reason", None)
        d.pop("timings", None)
        d["checks"] = [CheckResult(**c) for c in d.get("checks", [])]
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "GateReport":
        return cls.from_dict(json.loads(text))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)
