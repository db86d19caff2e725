"""The acceptance check: a fixed prompt set through the endpoint, spec-decode counters around it.

The counters are server-wide, so the gate reads them before and after and works on the difference; any
other traffic on the server during those seconds is counted too (gate a private endpoint). Kinds run one
after the other with a read in between, which gives a per-kind figure for free (drafters accept far more
on code and JSON than on prose, and a feature that hurts one kind shows there first).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import metrics as m
from .client import Client, RequestFailed
from .config import PROMPTS_DIR, AcceptanceConfig, is_prompt_set_path

KINDS = ("code", "json", "prose", "chat")
# vLLM records a step's counters in its output loop after the responses are queued, so a read made the
# moment the last answer arrives can miss the final step: read until two reads agree.
_SETTLE_INTERVAL_S = 0.25
_SETTLE_MAX_S = 5.0


class PromptSetError(ValueError):
    pass


@dataclass
class Prompt:
    id: str
    kind: str
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None


@dataclass
class PromptSet:
    name: str
    sha256: str
    prompts: list[Prompt]


def load_prompt_set(name: str) -> PromptSet:
    path = Path(name).expanduser() if is_prompt_set_path(name) else PROMPTS_DIR / f"{name}.jsonl"
    if not path.is_file():
        raise PromptSetError(f"prompt set {name!r}: {path} not found")
    raw = path.read_bytes()
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            p = Prompt(id=obj["id"], kind=obj["kind"], prompt=obj.get("prompt"), messages=obj.get("messages"))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise PromptSetError(f"{path}:{lineno}: not a prompt object ({exc})") from None
        if p.kind not in KINDS:
            raise PromptSetError(f"{path}:{lineno}: kind {p.kind!r} is not one of {KINDS}")
        if (p.prompt is None) == (p.messages is None):
            raise PromptSetError(f"{path}:{lineno}: give exactly one of prompt and messages")
        if p.id in seen:
            raise PromptSetError(f"{path}:{lineno}: duplicate id {p.id!r}")
        seen.add(p.id)
        prompts.append(p)
    if not prompts:
        raise PromptSetError(f"{path} holds no prompts")
    return PromptSet(name=name if not is_prompt_set_path(name) else str(path),
                     sha256=hashlib.sha256(raw).hexdigest(), prompts=prompts)


def messages_as_text(messages: list[dict[str, str]]) -> str:
    """Plain-text turns for a model without a chat template (the tiny test model has none)."""
    turns = [f"{t.get('role', 'user').capitalize()}: {t.get('content', '')}" for t in messages]
    return "\n\n".join(turns) + "\n\nAssistant:"


async def _generate(client: Client, p: Prompt, *, model: str, max_tokens: int) -> dict[str, Any]:
    base = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
    if p.messages is not None:
        try:
            text, ntok = await client.chat({**base, "messages": p.messages})
            return {"id": p.id, "kind": p.kind, "tokens": ntok, "endpoint": "chat", "text": text[:120]}
        except RequestFailed as exc:
            if exc.status != 400:
                raise
        text, ntok = await client.complete({**base, "prompt": messages_as_text(p.messages)})
        return {"id": p.id, "kind": p.kind, "tokens": ntok, "endpoint": "completions (no chat template)",
                "text": text[:120]}
    text, ntok = await client.complete({**base, "prompt": p.prompt})
    return {"id": p.id, "kind": p.kind, "tokens": ntok, "endpoint": "completions", "text": text[:120]}


async def read_metrics(client: Client) -> m.Snapshot:
    return m.parse(await client.metrics_text())


async def _settled(client: Client) -> m.Snapshot:
    snap = await read_metrics(client)
    deadline = time.monotonic() + _SETTLE_MAX_S
    while time.monotonic() < deadline:
        await asyncio.sleep(_SETTLE_INTERVAL_S)
        again = await read_metrics(client)
        if _spec_tuple(again) == _spec_tuple(snap):
            return again
        snap = again
    return snap


def _spec_tuple(s: m.Snapshot) -> tuple:
    if s.spec is None:
        return ()
    return (s.spec.drafts, s.spec.draft_tokens, s.spec.accepted, tuple(sorted(s.spec.accepted_per_pos.items())))


async def measure(client: Client, pset: PromptSet, cfg: AcceptanceConfig, *, model: str,
                  on_progress: Callable[[], None] | None = None) -> dict[str, Any] | None:
    """Run the prompt set once; the figures over the whole set and per kind. None: no spec counters."""
    first = await _settled(client)  # the smoke request may still be on its way into the counters
    if first.spec is None:
        return None
    t0 = time.perf_counter()
    generations: list[dict[str, Any]] = []
    errors: list[str] = []
    by_kind: dict[str, dict[str, Any]] = {}
    before = first
    for kind in KINDS:
        batch = [p for p in pset.prompts if p.kind == kind]
        if not batch:
            continue

        async def one(p: Prompt) -> None:
            try:
                generations.append(await _generate(client, p, model=model, max_tokens=cfg.max_tokens))
            except RequestFailed as exc:
                errors.append(f"{p.id}: {exc}")
            if on_progress:
                on_progress()

        await asyncio.gather(*(one(p) for p in batch))
        after = await _settled(client)
        d = m.delta(before, after)
        by_kind[kind] = m.acceptance_stats(d) if d is not None else {}
        before = after
    latency = time.perf_counter() - t0
    total = m.delta(first, before)
    stats = m.acceptance_stats(total) if total is not None else {}
    order = {p.id: i for i, p in enumerate(pset.prompts)}
    generations.sort(key=lambda g: order[g["id"]])
    return {
        **stats,
        "by_kind": by_kind,
        "radiance": m.radiance_delta(first, before),
        "requests": len(pset.prompts),
        "request_errors": errors,
        "output_tokens": sum(g["tokens"] for g in generations),
        "latency_s": latency,
        "generations": generations,
    }


def judge(cfg: AcceptanceConfig, run: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """Every threshold the run misses, as a sentence each."""
    misses: list[str] = []
    mal, rate, per_pos = run.get("mean_acceptance_length"), run.get("acceptance_rate"), run.get("per_position")
    if cfg.min_mean_acceptance_length is not None and (mal is None or mal < cfg.min_mean_acceptance_length):
        misses.append(f"mean acceptance length {_f(mal)} < {cfg.min_mean_acceptance_length:g}")
    if cfg.min_acceptance_rate is not None and (rate is None or rate < cfg.min_acceptance_rate):
        misses.append(f"acceptance rate {_f(rate)} < {cfg.min_acceptance_rate:g}")
    if cfg.min_per_position is not None:
        measured = per_pos or []
        if len(measured) < len(cfg.min_per_position):
            misses.append(f"{len(cfg.min_per_position)} position thresholds but the server reports "
                          f"{len(measured)} draft positions")
        for i, (got, want) in enumerate(zip(measured, cfg.min_per_position, strict=False)):
            if got is None or got < want:
                misses.append(f"position {i} rate {_f(got)} < {want:g}")
    if cfg.max_drop_vs_baseline is not None and baseline is not None:
        b = baseline.get("mean_acceptance_length")
        if b is not None and (mal is None or b - mal > cfg.max_drop_vs_baseline + 1e-12):
            misses.append(f"mean acceptance length {_f(mal)} is {_f(None if mal is None else b - mal)} below "
                          f"the baseline's {_f(b)} (allowed drop {cfg.max_drop_vs_baseline:g})")
    return misses


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


async def evaluate(client: Client, cfg: AcceptanceConfig, *, model: str,
                   baseline_client: Client | None = None, drafter: str | None = None,
                   on_start: Callable[[int], None] | None = None,
                   on_progress: Callable[[], None] | None = None) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, metrics) of the acceptance check."""
    if drafter == "none":
        return "skipped", "no drafter in this profile", {}
    pset = load_prompt_set(cfg.prompt_set)
    info: dict[str, Any] = {"prompt_set": {"name": pset.name, "sha256": pset.sha256, "prompts": len(pset.prompts)},
                            "max_tokens": cfg.max_tokens, "concurrency": cfg.concurrency,
                            "thresholds": _thresholds(cfg)}
    runs = 2 if cfg.baseline and baseline_client is not None else 1
    if on_start:
        on_start(runs * len(pset.prompts))
    run = await measure(client, pset, cfg, model=model, on_progress=on_progress)
    if run is None:
        if cfg.thresholds_set():
            return ("fail", "acceptance thresholds are set but the server exposes no spec-decode counters "
                    "(is it running without its drafter?)", info)
        return "skipped", "no spec-decode counters on /metrics: the server runs without a drafter", info
    metrics = {**info, **run}
    if run["request_errors"]:
        n = len(run["request_errors"])
        return "error", f"{n}/{run['requests']} prompt requests failed: {run['request_errors'][0]}", metrics

    baseline = None
    if cfg.baseline:
        if baseline_client is None:
            metrics["baseline"] = None
            if cfg.max_drop_vs_baseline is not None:
                return ("error", "max_drop_vs_baseline is set but no baseline endpoint was given "
                        "(run_gate(..., baseline_url=...))", metrics)
            metrics["baseline_note"] = "baseline requested but no baseline endpoint was given"
        else:
            baseline = await measure(baseline_client, pset, cfg, model=model, on_progress=on_progress)
            if baseline is None:
                return "error", "the baseline endpoint exposes no spec-decode counters", metrics
            if baseline["request_errors"]:
                return "error", f"baseline prompt request failed: {baseline['request_errors'][0]}", {
                    **metrics, "baseline": baseline}
            metrics["baseline"] = baseline

    if not run.get("num_drafts"):
        return "fail", "no drafts were made while the prompt set ran (speculative decoding inactive?)", metrics
    misses = judge(cfg, run, baseline)
    metrics["violations"] = misses
    if misses:
        return "fail", "; ".join(misses), metrics
    summary = (f"mean acceptance length {_f(run['mean_acceptance_length'])}, acceptance rate "
               f"{_f(run['acceptance_rate'])} over {run['num_drafts']} drafts")
    if baseline is not None:
        summary += f" (baseline {_f(baseline.get('mean_acceptance_length'))})"
    if not cfg.thresholds_set():
        summary += "; no thresholds set (informational)"
    return "pass", summary, metrics


def _thresholds(cfg: AcceptanceConfig) -> dict[str, Any]:
    return {"min_mean_acceptance_length": cfg.min_mean_acceptance_length,
            "min_acceptance_rate": cfg.min_acceptance_rate, "min_per_position": cfg.min_per_position,
            "max_drop_vs_baseline": cfg.max_drop_vs_baseline}
