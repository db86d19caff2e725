"""Run the gate against an OpenAI-compatible endpoint: smoke, target, speed, acceptance, GSM8K, in that order.

``run_gate`` is the blocking entry point (CLI); code already inside an event loop (the gateway) awaits
``run_gate_async`` instead, so that the loop keeps answering ``/v1/health/live`` while the gate runs.

An endpoint that does not answer (or rejects the API key, or answers ``/v1/models`` with an error) raises
``EndpointUnreachable``: that says nothing about the model and gets its own exit code. Everything after
that first answer ends up in the report: a check that cannot complete is an ``error``, which blocks
exposure just as a ``fail`` does.
"""
from __future__ import annotations

import asyncio
import functools
import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from . import acceptance, gsm8k, speed, target
from .client import Client, EndpointUnreachable, RequestFailed, endpoint_root, redact_url
from .config import GateConfig
from .result import CheckResult, GateReport

__all__ = ["run_gate", "run_gate_async", "GateReport", "CheckResult", "EndpointUnreachable"]

_PREFLIGHT_TIMEOUT_S = 15.0
_PREFLIGHT_RETRIES = 2
# Context keys whose values are never written out, whatever the caller put there.
_SECRET_KEY = re.compile(r"(^|[_.-])(api[_-]?key|key|token|secret|password|passwd|credentials?|authorization)$",
                         re.I)
REDACTED = "***"


def run_gate(cfg: GateConfig, base_url: str, *, model: str, api_key: str | None = None,
             progress: bool = True, context: dict | None = None,
             baseline_url: str | None = None, reference: Path | None = None,
             identity: dict | None = None) -> GateReport:
    """Blocking form of :func:`run_gate_async` (runs it on a private loop if one is already running)."""
    coro = run_gate_async(cfg, base_url, model=model, api_key=api_key, progress=progress, context=context,
                          baseline_url=baseline_url, reference=reference, identity=identity)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="radiance-gate") as pool:
        return pool.submit(asyncio.run, coro).result()


async def run_gate_async(cfg: GateConfig, base_url: str, *, model: str, api_key: str | None = None,
                         progress: bool = True, context: dict | None = None,
                         baseline_url: str | None = None, reference: Path | None = None,
                         identity: dict | None = None) -> GateReport:
    """Run every enabled check. ``context`` (profile name and hash, versions, arch, features applied and
    declined, ...) is copied into the report; its ``drafter`` entry, when ``"none"``, skips acceptance.
    ``baseline_url``: the same profile served with its features off, for ``acceptance.baseline``.
    ``reference``: the target check's stock reference (default: found for ``context["profile"]``, see
    ``target.reference_path``); ``identity``: the profile's model, dtype, quantisation and TP, which the
    reference must have been recorded with (None: not compared)."""
    started = _now()
    t0 = time.perf_counter()
    context = dict(context or {})
    served = await preflight(base_url, api_key)
    if baseline_url is not None and cfg.acceptance.enabled and cfg.acceptance.baseline:
        await preflight(baseline_url, api_key)

    checks: list[CheckResult] = []
    with _Progress(progress) as bar:
        if served and model not in served:
            checks.append(CheckResult("smoke", "fail", f"model {model!r} is not served here (served: "
                                      f"{', '.join(served)})"))
        elif cfg.smoke.enabled:
            checks.append(await _timed("smoke", lambda: _smoke(cfg, base_url, api_key, model)))
        else:
            checks.append(CheckResult("smoke", "skipped", "disabled in the profile"))
        blocked = checks[0].blocking

        # in order; each (name, enabled, what the progress bar calls it, the check given its bar's hooks)
        steps = [
            ("target", cfg.target.enabled, "target check", lambda start, step: _target(
                cfg, base_url, api_key, model, context, reference, identity, start, step)),
            ("speed", cfg.speed.enabled, "speed check", lambda start, step: _speed(
                cfg, base_url, api_key, model, context, reference, identity, start, step)),
            ("acceptance", cfg.acceptance.enabled, "acceptance prompts", lambda start, step: _acceptance(
                cfg, base_url, baseline_url, api_key, model, context, start, step)),
            ("gsm8k", cfg.gsm8k.enabled, "GSM8K", lambda start, step: _gsm8k(
                cfg, base_url, api_key, model, start, step)),
        ]
        for name, enabled, label, check in steps:
            result = _skipped(name, enabled, blocked)
            if result is None:
                start, step = bar.hooks(label)
                result = await _timed(name, functools.partial(check, start, step))
            checks.append(result)

    report = GateReport(
        checks=checks,
        model=model,
        endpoint=redact_url(endpoint_root(base_url)),
        started_at=started,
        finished_at=_now(),
        duration_s=time.perf_counter() - t0,
        context=context,
        config=cfg.model_dump(mode="json"),
        served_models=served,
    )
    if baseline_url is not None:
        report.context.setdefault("baseline_endpoint", redact_url(endpoint_root(baseline_url)))
    return scrub(report, [api_key] if api_key else [])


# -- checks ----------------------------------------------------------------------------

async def preflight(base_url: str, api_key: str | None) -> list[str]:
    where = redact_url(endpoint_root(base_url))
    async with Client(base_url, api_key=api_key, timeout_s=_PREFLIGHT_TIMEOUT_S, retries=_PREFLIGHT_RETRIES,
                      concurrency=1) as client:
        try:
            return await client.models()
        except RequestFailed as exc:
            if exc.status in (401, 403):
                raise EndpointUnreachable(f"{where} rejected the API key (HTTP {exc.status})") from None
            if exc.status is None and not exc.transport:
                raise EndpointUnreachable(f"{where} answered /v1/models with something other than a model "
                                          "list (not an OpenAI-compatible server?)") from None
            raise EndpointUnreachable(f"{where} did not answer /v1/models: {exc}") from None


async def _smoke(cfg: GateConfig, base_url: str, api_key: str | None, model: str) -> tuple[str, str, dict]:
    s = cfg.smoke
    async with Client(base_url, api_key=api_key, timeout_s=s.timeout_s, retries=s.retries, concurrency=1) as client:
        payload = {"model": model, "prompt": s.prompt, "max_tokens": s.max_tokens, "temperature": 0.0}
        t0 = time.perf_counter()
        text, ntok = await client.complete(payload)
        metrics = {"latency_s": time.perf_counter() - t0, "completion_tokens": ntok, "text": text[:200]}
    if not text:
        return "fail", "the completion returned no text", metrics
    return "pass", f"{ntok} tokens in {metrics['latency_s']:.2f} s", metrics


async def _acceptance(cfg: GateConfig, base_url: str, baseline_url: str | None, api_key: str | None,
                      model: str, context: dict, start: Callable, step: Callable) -> tuple[str, str, dict]:
    a = cfg.acceptance
    kw = dict(api_key=api_key, timeout_s=a.timeout_s, retries=a.retries, concurrency=a.concurrency)
    drafter = context.get("drafter")
    async with Client(base_url, **kw) as client:
        if a.baseline and baseline_url is not None:
            async with Client(baseline_url, **kw) as base_client:
                return await acceptance.evaluate(client, a, model=model, baseline_client=base_client,
                                                 drafter=drafter, on_start=start, on_progress=step)
        return await acceptance.evaluate(client, a, model=model, drafter=drafter, on_start=start,
                                         on_progress=step)


async def _target(cfg: GateConfig, base_url: str, api_key: str | None, model: str, context: dict,
                  reference: Path | None, identity: dict | None, start: Callable,
                  step: Callable) -> tuple[str, str, dict]:
    t = cfg.target
    name = context.get("profile")
    if reference is None:
        reference = target.reference_path(t, name)
    fix = ("record one from a stock run with `radiance gate PROFILE --record-reference`"
           + (f" (it writes {target.recorded_path(name)})" if name else "")
           + ", or set gate.target.enabled: false")
    async with Client(base_url, api_key=api_key, timeout_s=t.timeout_s, retries=t.retries, concurrency=1) as client:
        return await target.evaluate(client, t, model=model, reference=reference, ident=identity, fix=fix,
                                     on_start=start, on_progress=step)


async def _speed(cfg: GateConfig, base_url: str, api_key: str | None, model: str, context: dict,
                 reference: Path | None, identity: dict | None, start: Callable,
                 step: Callable) -> tuple[str, str, dict]:
    s = cfg.speed
    name = context.get("profile")
    if reference is None:
        reference = target.reference_path(cfg.target, name)
    fix = ("record one on this machine from a stock run with `radiance gate PROFILE --record-reference`, or set "
           "gate.speed.enabled: false")
    async with Client(base_url, api_key=api_key, timeout_s=s.timeout_s, retries=s.retries,
                      concurrency=max(s.batch_sizes)) as client:
        return await speed.evaluate(client, s, model=model, reference=reference, ident=identity,
                                    features=list(context.get("features_enabled") or []),
                                    platform=context.get("platform"), fix=fix, on_start=start, on_progress=step)


async def _gsm8k(cfg: GateConfig, base_url: str, api_key: str | None, model: str,
                 start: Callable, step: Callable) -> tuple[str, str, dict]:
    g = cfg.gsm8k
    async with Client(base_url, api_key=api_key, timeout_s=g.timeout_s, retries=g.retries,
                      concurrency=g.concurrency) as client:
        return await gsm8k.evaluate(client, g, model=model, on_start=start, on_progress=step)


def _skipped(name: str, enabled: bool, blocked: bool) -> CheckResult | None:
    """The check's result when it does not run (off in the profile, or the smoke check failed)."""
    if not enabled:
        return CheckResult(name, "skipped", "disabled in the profile")
    if blocked:
        return CheckResult(name, "skipped", "smoke check did not pass")
    return None


async def _timed(name: str, fn: Callable[[], Awaitable[tuple[str, str, dict]]]) -> CheckResult:
    t0 = time.perf_counter()
    try:
        status, reason, metrics = await fn()
    except (RequestFailed, acceptance.PromptSetError, gsm8k.Gsm8kDataError, target.TargetDataError,
            ValueError) as exc:  # KnobError (a bad RADIANCE_GATE_SPEED_ENFORCE) is a ValueError too
        status, reason, metrics = "error", str(exc), {}
    except Exception as exc:  # a check must never take the gate down without a report
        status, reason, metrics = "error", f"{type(exc).__name__}: {exc}", {}
    return CheckResult(name, status, reason, metrics, duration_s=time.perf_counter() - t0)


# -- helpers ---------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def scrub(report: GateReport, secrets: list[str]) -> GateReport:
    """No secret in a report: secret-looking context keys and every occurrence of a secret value are
    replaced; NaN and infinities (not JSON) become None."""
    secrets = [s for s in secrets if s]

    def clean(obj: Any, keys: bool = False) -> Any:
        if isinstance(obj, dict):
            return {k: (REDACTED if keys and _SECRET_KEY.search(str(k)) and v not in (None, "", False)
                        else clean(v, keys)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [clean(v, keys) for v in obj]
        if isinstance(obj, str):
            for s in secrets:
                obj = obj.replace(s, REDACTED)
            return obj
        if isinstance(obj, float) and not math.isfinite(obj):
            return None
        return obj

    report.context = clean(report.context, keys=True)
    report.served_models = clean(report.served_models)
    for c in report.checks:
        c.reason = clean(c.reason)
        c.metrics = {k: clean(v) for k, v in c.metrics.items()}
    return report


class _Progress:
    """A rich progress bar on stderr (stdout may carry --json), only on a terminal and when asked."""

    def __init__(self, enabled: bool):
        self._bar: Progress | None = None
        if enabled:
            console = Console(stderr=True)
            if console.is_terminal:
                self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(), console=console)

    def __enter__(self) -> "_Progress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def hooks(self, description: str) -> tuple[Callable[[int], None], Callable[[], None]]:
        state: dict[str, Any] = {}
        bar = self._bar

        def start(total: int) -> None:
            if bar is not None:
                state["task"] = bar.add_task(description, total=total)

        def step() -> None:
            if bar is not None and "task" in state:
                bar.advance(state["task"])

        return start, step
