"""The speed check: decode throughput at fixed batch sizes against the stock reference's, on this machine.

The target check says the features did not damage the model; this one says they did not slow it down.
`radiance gate PROFILE --record-reference` measures a fixed workload on stock (the profile with its features
off) and writes the figures into the same reference document (its ``speed`` section); the gate measures the
same workload through the endpoint it gates and divides. Below ``gate.speed.min_ratio`` at any batch size
the check fails with one line that names the feature set, the ratio and the fix.

The workload, per batch size B: B greedy completions sent together (the prompt set's first B prompts,
cycled), ``max_tokens`` long (``ignore_eos``, so every round decodes the same number of tokens), and the
same B prompts for one token. Decode tok/s = B * (max_tokens - 1) / (time of the long round - time of the
one-token round): the prefill, the HTTP round trip and the scheduling of the first step cancel out, as in
``radiance bench`` (which subtracts its one-token run the same way). Each round runs ``repeats`` times after
one warm-up and the fastest counts: interference from anything else on the machine only ever slows a round.

On the CPU platform the check reports and never fails (vLLM's CPU path runs the features' reference
kernels, which are not what a GPU deployment is judged on); ``RADIANCE_GATE_SPEED_ENFORCE=1`` (tests and
drills) enforces it there too.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

from radiance import envs

from .acceptance import load_prompt_set
from .client import Client, RequestFailed
from .config import SpeedConfig
from .target import IDENTITY_KEYS, ReferenceError, greedy_prompts, load_reference


def workload(cfg: SpeedConfig) -> dict[str, Any]:
    """What a reference's figures were measured on; the gate compares only the same workload."""
    pset = load_prompt_set(cfg.prompt_set)
    return {"prompt_set": {"name": pset.name, "sha256": pset.sha256}, "max_tokens": cfg.max_tokens,
            "repeats": cfg.repeats}


def enforced(platform: str | None) -> bool:
    """Whether a ratio below the bound fails the gate: everywhere but the CPU, unless the switch is on."""
    return platform != "cpu" or bool(envs.get("RADIANCE_GATE_SPEED_ENFORCE"))


# -- measuring -------------------------------------------------------------------------

async def _round(client: Client, prompts: list[str], *, model: str, max_tokens: int) -> float:
    """Seconds for ``prompts`` sent together, each decoding exactly ``max_tokens`` greedy tokens."""
    async def one(prompt: str) -> None:
        _, ntok = await client.complete({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                         "temperature": 0.0, "extra_body": {"ignore_eos": True}})
        if ntok != max_tokens:
            raise RequestFailed(f"a speed round asked for {max_tokens} tokens and got {ntok} (ignore_eos is "
                                "needed, and a max_model_len with room for them)")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - t0


async def measure(client: Client, cfg: SpeedConfig, *, model: str,
                  on_progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """Decode tok/s per batch size (keys are str(B): the JSON document's), and the rounds' timings."""
    texts = [text for _, text in greedy_prompts(load_prompt_set(cfg.prompt_set))]
    out: dict[str, Any] = {"decode_tok_s": {}, "rounds_s": {}}
    for b in cfg.batch_sizes:
        prompts = [texts[i % len(texts)] for i in range(b)]
        await _round(client, prompts, model=model, max_tokens=cfg.max_tokens)  # warm-up: shapes, caches
        full = [await _round(client, prompts, model=model, max_tokens=cfg.max_tokens) for _ in range(cfg.repeats)]
        one = [await _round(client, prompts, model=model, max_tokens=1) for _ in range(cfg.repeats)]
        decode_s = min(full) - min(one)
        if decode_s <= 0:
            raise RequestFailed(f"at B={b} the {cfg.max_tokens}-token round took no longer than the 1-token "
                                f"one ({min(full):.3f} s vs {min(one):.3f} s) — fix: raise gate.speed.max_tokens")
        out["decode_tok_s"][str(b)] = b * (cfg.max_tokens - 1) / decode_s
        out["rounds_s"][str(b)] = {"full": full, "one_token": one}
        if on_progress:
            on_progress()
    return out


async def record(base_url: str, api_key: str | None, cfg: SpeedConfig, *, model: str,
                 platform: str | None) -> dict[str, Any]:
    """The reference's ``speed`` section, measured on the endpoint (which the caller vouches for as stock)."""
    async with Client(base_url, api_key=api_key, timeout_s=cfg.timeout_s, retries=cfg.retries,
                      concurrency=max(cfg.batch_sizes)) as client:
        got = await measure(client, cfg, model=model)
    return {"platform": platform, "workload": workload(cfg), **got}


# -- the check -------------------------------------------------------------------------

def fix_for(features: list[str]) -> str:
    """What to turn off: the one feature on, or each in turn to find the one that costs the speed."""
    if not features:
        return ("no feature is on, so the engine itself is slower than the stock it was recorded as — fix: "
                "re-record the reference on this machine (radiance gate PROFILE --record-reference)")
    fields = [f"features.{f}" for f in features]  # every feature takes `false` for `enabled: false`
    if len(fields) == 1:
        return f"fix: set {fields[0]}: false"
    return f"fix: set {', '.join(fields)} false one at a time and gate again; the one whose removal passes costs it"


def judge(cfg: SpeedConfig, ratios: dict[str, float], features: list[str]) -> str | None:
    """The one line a miss fails with, or None."""
    low = {b: r for b, r in ratios.items() if r < cfg.min_ratio}
    if not low:
        return None
    where = ", ".join(f"{r:.2f}x (B={b})" for b, r in low.items())
    names = "+".join(features) or "stock (no feature on)"
    return f"{names} decodes at {where} of stock's tok/s (min {cfg.min_ratio:g}) — {fix_for(features)}"


def _reference_speed(path: Path, cfg: SpeedConfig, ident: dict[str, Any] | None) -> dict[str, Any] | None:
    """The reference's speed section if it can be compared with this run; None if it has none; raises
    ReferenceError when it was measured on something else."""
    doc = load_reference(path)
    section = doc.get("speed")
    if not isinstance(section, dict):
        return None
    if ident is not None:
        recorded = doc.get("identity") or {}
        diff = [k for k in IDENTITY_KEYS if recorded.get(k) != ident.get(k)]
        if diff:
            raise ReferenceError(f"reference {path} was recorded with another {', '.join(diff)}")
    if section.get("workload") != workload(cfg):
        raise ReferenceError(f"reference {path} timed another workload (prompt set, max_tokens or repeats) than "
                             "gate.speed asks")
    missing = [b for b in cfg.batch_sizes if str(b) not in (section.get("decode_tok_s") or {})]
    if missing:
        raise ReferenceError(f"reference {path} has no figure at B={', '.join(map(str, missing))}")
    return section


async def evaluate(client: Client, cfg: SpeedConfig, *, model: str, reference: Path | None,
                   ident: dict[str, Any] | None, features: list[str], platform: str | None, fix: str,
                   on_start: Callable[[int], None] | None = None,
                   on_progress: Callable[[], None] | None = None) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, metrics). ``fix``: how to record a reference for this profile. ``platform``: the
    endpoint's (None: unknown), or else the reference's decides whether a miss fails."""
    info: dict[str, Any] = {"min_ratio": cfg.min_ratio, "batch_sizes": list(cfg.batch_sizes),
                            "features": features}
    if reference is None:
        return "error", f"no stock reference for this profile — fix: {fix}", info
    info["reference"] = str(reference)
    try:
        ref = _reference_speed(reference, cfg, ident)
    except ReferenceError as exc:
        return "error", f"{exc} — fix: {fix}", info
    if ref is None:
        # References recorded before the speed check (and those shipped with the package, timed on another
        # machine) carry no figures: nothing to compare with, which is said rather than guessed at.
        return "skipped", f"reference {reference} has no speed figures — fix: {fix}", info
    platform = platform or ref.get("platform")
    info["platform"] = platform
    info["enforced"] = enforced(platform)
    if on_start:
        on_start(len(cfg.batch_sizes))
    got = await measure(client, cfg, model=model, on_progress=on_progress)
    stock = {b: float(ref["decode_tok_s"][str(b)]) for b in cfg.batch_sizes}
    ratios = {str(b): got["decode_tok_s"][str(b)] / stock[b] for b in cfg.batch_sizes}
    info.update({"ratio": ratios, "decode_tok_s": got["decode_tok_s"],
                 "reference_decode_tok_s": {str(b): v for b, v in stock.items()}, "rounds_s": got["rounds_s"]})
    miss = judge(cfg, ratios, features)
    info["below_min"] = miss is not None
    if miss and info["enforced"]:
        return "fail", miss, info
    summary = ", ".join(f"B={b} {r:.2f}x ({got['decode_tok_s'][b]:.1f} vs {stock[int(b)]:.1f} tok/s)"
                        for b, r in ratios.items())
    if not info["enforced"]:
        summary = (f"report-only on {platform}: " + (miss if miss else f"{summary} of stock (min {cfg.min_ratio:g})"))
    else:
        summary += f" of stock (min {cfg.min_ratio:g})"
    return "pass", summary, info
