"""The target check: the served model against a reference recorded from stock on the same model and text.

Acceptance length says how often the drafter agrees with the target, not whether the target is still
right: a feature that damages the target (its head, its residual stream) can pass every other check.
This one measures the target itself, two ways:

* the mean negative log-likelihood per token of a fixed held text (``launcher/data/target/vN.txt``),
  scored through the endpoint's prompt logprobs (vLLM's ``prompt_logprobs`` on ``/v1/completions``,
  with ``return_token_ids`` so that the scored tokens are known and compared with the reference's);
* greedy agreement with the reference's outputs on a prompt set: per prompt the tokens before the first
  difference, over all prompts the share of reference tokens so matched (prefix agreement) and the share
  of prompts identical to the end (full agreement). Every output is ``max_tokens`` long
  (``ignore_eos``), so a run that stops early cannot look like agreement.

The reference is a JSON file written by ``radiance gate PROFILE --record-reference`` from a stock run
(the profile with its four features off): ``<state dir>/references/<profile>.json`` when one was
recorded on this machine, else the profile's ``gate.target.reference`` (a reference shipped in
``launcher/data/target/references/`` or a path). It names the model, dtype, quantisation and TP it was
recorded with and the sha256 of its text and prompts; a reference that does not match the profile is an
error, not a comparison.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .. import paths
from .acceptance import PromptSet, load_prompt_set, messages_as_text
from .client import Client, RequestFailed
from .config import REFERENCES_DIR, TARGET_DIR, TargetConfig, is_path

SCHEMA_VERSION = 1
KIND = "radiance-target-reference"
# What a reference must share with the profile it is used for: a different checkpoint, dtype, quantisation
# or TP layout serves different numerics, and comparing against it would measure that instead.
IDENTITY_KEYS = ("model", "dtype", "quantization", "tp")


class ReferenceError(ValueError):
    """No usable reference: missing, unreadable, or recorded for something else."""


class TargetDataError(ValueError):
    pass


@dataclass
class HeldText:
    name: str
    sha256: str
    text: str


def load_held_text(name: str) -> HeldText:
    path = Path(name).expanduser() if is_path(name, ".txt") else TARGET_DIR / f"{name}.txt"
    if not path.is_file():
        raise TargetDataError(f"held text {name!r}: {path} not found")
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    if not text.strip():
        raise TargetDataError(f"held text {path} is empty")
    return HeldText(name=name if not is_path(name, ".txt") else str(path), sha256=hashlib.sha256(raw).hexdigest(),
                    text=text)


def identity(profile) -> dict[str, Any]:
    """What of a profile decides the target's numerics when every feature is off."""
    return {"model": profile.model.path, "dtype": profile.model.dtype, "quantization": profile.model.quantization,
            "tp": profile.parallel.tp}


def recorded_path(profile_name: str) -> Path:
    """Where ``--record-reference`` writes by default, and the first place the gate looks."""
    from .. import paths

    return paths.state_home() / "references" / f"{profile_name}.json"


def reference_path(cfg: TargetConfig, profile_name: str | None) -> Path | None:
    """The reference the gate uses: one recorded on this machine for this profile, else the profile's
    ``gate.target.reference``; None when neither names a file that exists (the caller says what to do)."""
    if profile_name:
        mine = recorded_path(profile_name)
        if mine.is_file():
            return mine
    if cfg.reference is None:
        return None
    if is_path(cfg.reference, ".json"):
        return Path(cfg.reference).expanduser()
    return REFERENCES_DIR / f"{cfg.reference}.json"


def load_reference(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReferenceError(f"reference {path} not found") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReferenceError(f"reference {path} is unreadable ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("schema_version") != SCHEMA_VERSION:
        raise ReferenceError(f"{path} is not a version-{SCHEMA_VERSION} target reference")
    try:
        doc["held_text"]["mean_nll"], doc["held_text"]["token_ids"], doc["greedy"]["outputs"]
    except (KeyError, TypeError):
        raise ReferenceError(f"{path} lacks held_text or greedy outputs") from None
    return doc


# -- measuring -------------------------------------------------------------------------

async def score_text(client: Client, text: str, *, model: str) -> dict[str, Any]:
    """Mean NLL per token of ``text`` as the endpoint scores it (every token after the first)."""
    choice = await client.completion_choice({
        "model": model, "prompt": text, "max_tokens": 1, "temperature": 0.0,
        "extra_body": {"prompt_logprobs": 0, "return_token_ids": True}})
    ids, rows = choice.get("prompt_token_ids"), choice.get("prompt_logprobs")
    if not isinstance(ids, list) or not isinstance(rows, list) or len(ids) != len(rows) or len(ids) < 2:
        raise RequestFailed("the endpoint returned no prompt logprobs (vLLM's prompt_logprobs and "
                            "return_token_ids on /v1/completions are needed)")
    logprobs: list[float] = []
    for i, (tok, row) in enumerate(zip(ids, rows)):
        if i == 0:
            continue  # the first token has no context to be predicted from
        entry = (row or {}).get(str(tok))
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), (int, float)):
            raise RequestFailed(f"prompt logprobs lack token {tok} at position {i}")
        logprobs.append(float(entry["logprob"]))
    return {"tokens": len(logprobs), "mean_nll": -sum(logprobs) / len(logprobs), "token_ids": list(ids)}


def greedy_prompts(pset: PromptSet) -> list[tuple[str, str]]:
    """(id, completion prompt): chat turns as plain text, so every output comes from the same route."""
    return [(p.id, p.prompt if p.prompt is not None else messages_as_text(p.messages or [])) for p in pset.prompts]


async def greedy(client: Client, pset: PromptSet, *, model: str, max_tokens: int,
                 on_progress: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Each prompt's greedy output token ids, one request after the other (the batch stays one wide)."""
    out = []
    for pid, prompt in greedy_prompts(pset):
        choice = await client.completion_choice({
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "extra_body": {"ignore_eos": True, "return_token_ids": True}})
        ids = choice.get("token_ids")
        if not isinstance(ids, list):
            raise RequestFailed("the endpoint returned no token ids (vLLM's return_token_ids is needed)")
        out.append({"id": pid, "token_ids": [int(t) for t in ids]})
        if on_progress:
            on_progress()
    return out


def agreement(reference: list[dict[str, Any]], got: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens before the first difference per prompt, their share of the reference's tokens, and the share
    of prompts identical to the end."""
    mine = {g["id"]: g["token_ids"] for g in got}
    per_prompt, same, total, full = [], 0, 0, 0
    for r in reference:
        ref, ids = r["token_ids"], mine.get(r["id"], [])
        d = next((i for i, (a, b) in enumerate(zip(ref, ids)) if a != b), min(len(ref), len(ids)))
        per_prompt.append({"id": r["id"], "prefix_tokens": d, "reference_tokens": len(ref)})
        same += d
        total += len(ref)
        full += int(ids == ref)
    n = len(reference)
    return {"prefix_agreement": same / total if total else 1.0, "full_agreement": full / n if n else 1.0,
            "prompts_identical": full, "prompts": n, "per_prompt": per_prompt}


# -- the reference ---------------------------------------------------------------------

async def record(client: Client, cfg: TargetConfig, *, model: str, ident: dict[str, Any], profile: str,
                 source: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """Measure the endpoint (which the caller vouches for as stock) and return the reference document."""
    held = load_held_text(cfg.held_text)
    pset = load_prompt_set(cfg.prompt_set)
    scored = await score_text(client, held.text, model=model)
    outputs = await greedy(client, pset, model=model, max_tokens=cfg.max_tokens)
    return {
        "kind": KIND, "schema_version": SCHEMA_VERSION,
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "recorded_by": "radiance gate --record-reference", "source": source, "profile": profile,
        "identity": ident, "context": context or {},
        "held_text": {"name": held.name, "sha256": held.sha256, **scored},
        "greedy": {"prompt_set": {"name": pset.name, "sha256": pset.sha256}, "max_tokens": cfg.max_tokens,
                   "outputs": outputs},
    }


def write_reference(doc: dict[str, Any], path: Path) -> Path:
    """Atomically: a gate reading the reference while it is recorded sees the old one or the new one."""
    path = Path(path).expanduser()
    paths.write_atomically(path, json.dumps(doc, indent=1) + "\n")
    return path


def _mismatch(doc: dict[str, Any], path: Path, cfg: TargetConfig, ident: dict[str, Any] | None,
              held: HeldText, pset: PromptSet) -> str | None:
    """Why ``doc`` cannot be compared with this run, or None."""
    if ident is not None:
        recorded = doc.get("identity") or {}
        diff = [f"{k} {recorded.get(k)!r} (this profile: {ident.get(k)!r})" for k in IDENTITY_KEYS
                if recorded.get(k) != ident.get(k)]
        if diff:
            return f"reference {path} was recorded with " + ", ".join(diff)
    if doc["held_text"].get("sha256") != held.sha256:
        return f"reference {path} was recorded on another held text than {held.name!r}"
    g = doc["greedy"]
    if (g.get("prompt_set") or {}).get("sha256") != pset.sha256:
        return f"reference {path} was recorded on another prompt set than {pset.name!r}"
    if g.get("max_tokens") != cfg.max_tokens:
        return f"reference {path} was recorded with max_tokens {g.get('max_tokens')}, the profile asks {cfg.max_tokens}"
    return None


# -- the check -------------------------------------------------------------------------

def judge(cfg: TargetConfig, nll_increase: float, agree: dict[str, Any]) -> list[str]:
    """Every threshold the run misses, as a sentence each."""
    misses = []
    if cfg.max_nll_increase is not None and nll_increase > cfg.max_nll_increase + 1e-12:
        misses.append(f"mean NLL {nll_increase:+.4f} nats/token against stock (allowed +{cfg.max_nll_increase:g})")
    if cfg.min_prefix_agreement is not None and agree["prefix_agreement"] < cfg.min_prefix_agreement:
        misses.append(f"greedy prefix agreement with stock {agree['prefix_agreement']:.3f} < "
                      f"{cfg.min_prefix_agreement:g}")
    if cfg.min_full_agreement is not None and agree["full_agreement"] < cfg.min_full_agreement:
        misses.append(f"{agree['prompts_identical']}/{agree['prompts']} prompts identical to stock "
                      f"({agree['full_agreement']:.3f} < {cfg.min_full_agreement:g})")
    return misses


def thresholds(cfg: TargetConfig) -> dict[str, Any]:
    return {"max_nll_increase": cfg.max_nll_increase, "min_prefix_agreement": cfg.min_prefix_agreement,
            "min_full_agreement": cfg.min_full_agreement}


async def evaluate(client: Client, cfg: TargetConfig, *, model: str, reference: Path | None,
                   ident: dict[str, Any] | None, fix: str,
                   on_start: Callable[[int], None] | None = None,
                   on_progress: Callable[[], None] | None = None) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, metrics) of the target check. ``fix`` is what to do when there is no usable
    reference (the command that records one for this profile)."""
    info: dict[str, Any] = {"thresholds": thresholds(cfg), "max_tokens": cfg.max_tokens}
    if reference is None:
        return "error", f"no stock reference for this profile — fix: {fix}", info
    info["reference"] = str(reference)
    held = load_held_text(cfg.held_text)
    pset = load_prompt_set(cfg.prompt_set)
    try:
        doc = load_reference(reference)
    except ReferenceError as exc:
        return "error", f"{exc} — fix: {fix}", info
    problem = _mismatch(doc, reference, cfg, ident, held, pset)
    if problem:
        return "error", f"{problem} — fix: {fix}", info
    info["reference_recorded"] = {k: doc.get(k) for k in ("recorded_at", "source", "profile")}
    if on_start:
        on_start(1 + len(pset.prompts))
    scored = await score_text(client, held.text, model=model)
    if on_progress:
        on_progress()
    ref_held = doc["held_text"]
    if scored["token_ids"] != ref_held["token_ids"]:
        return "error", (f"the endpoint tokenises held text {held.name!r} differently from the reference "
                         f"({len(scored['token_ids'])} vs {len(ref_held['token_ids'])} tokens) — fix: {fix}"), info
    outputs = await greedy(client, pset, model=model, max_tokens=cfg.max_tokens, on_progress=on_progress)
    agree = agreement(doc["greedy"]["outputs"], outputs)
    increase = scored["mean_nll"] - float(ref_held["mean_nll"])
    metrics = {**info, "held_text": held.name, "held_tokens": scored["tokens"], "mean_nll": scored["mean_nll"],
               "reference_mean_nll": float(ref_held["mean_nll"]), "nll_increase": increase, **agree}
    misses = judge(cfg, increase, agree)
    metrics["violations"] = misses
    if misses:
        return "fail", "; ".join(misses), metrics
    summary = (f"mean NLL {increase:+.4f} nats/token against stock ({scored['mean_nll']:.4f}), greedy prefix "
               f"agreement {agree['prefix_agreement']:.3f}, {agree['prompts_identical']}/{agree['prompts']} "
               "prompts identical")
    if not cfg.thresholds_set():
        summary += "; no thresholds set (informational)"
    return "pass", summary, metrics
