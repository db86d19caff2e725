"""GSM8K by vLLM's CI protocol, scored three ways, with a Wilson interval.

Protocol (vLLM ``tests/evals/gsm8k``): ``num_shots`` worked examples from train[0:num_shots], each as
``"Question: {q}\\nAnswer: {a}\\n\\n"``, then ``"Question: {q}\\nAnswer:"``; ``/v1/completions`` at
temperature 0, ``max_tokens`` 256, stop at "Question", "Assistant:" and "<|separator|>".

Scores:
- ``accuracy`` (the gated one): the last number of the response, thousands commas removed, compared with
  the gold number. Unlike the upstream extractor (``\\d+``), a minus sign is kept — GSM8K has negative gold
  answers (2 in test, 3 in train) that upstream can never score — and decimals are read whole, so "2.5"
  is 2.5, not 5. A minus is a sign only where it cannot be subtraction (not after a digit, letter or ")").
- ``strict_accuracy``: lm-eval's strict-match, the first ``#### (-?[0-9.,]+)``.
- ``flexible_accuracy``: lm-eval's flexible-extract, the last ``(-?[$0-9.,]{2,})|(-?[0-9]+)``.
  Both compared as lm-eval does: as strings after removing "," and "$" and a trailing ".".

The data is read from disk only (never fetched): a directory given in the profile, or the copy packaged
under launcher/data/gsm8k (test.jsonl and train[0:5]; see SOURCE.md there).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable

from .client import Client, RequestFailed
from .config import Gsm8kConfig

PACKAGED_DIR = Path(__file__).resolve().parent.parent / "data" / "gsm8k"
STOP = ["Question", "Assistant:", "<|separator|>"]
Z95 = 1.959963984540054  # two-sided 95% normal quantile

_MINUSES = str.maketrans({"\u2212": "-", "\u2013": "-"})  # minus sign, en dash
_NUMBER = re.compile(r"-?\$?\d+(?:\.\d+)?")
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_GOLD = re.compile(r"####\s*(.+?)\s*$", re.S)
_KEEP_RESPONSES = 20  # wrong answers kept verbatim in the report, for a person to look at


class Gsm8kDataError(ValueError):
    """The GSM8K files are missing or malformed."""


@dataclass
class Dataset:
    test: list[dict[str, str]]
    shots: list[dict[str, str]]
    origin: str  # "packaged" or the directory
    test_sha256: str


def _read_jsonl(path: Path, limit: int | None = None) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise Gsm8kDataError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not {"question", "answer"} <= row.keys():
                raise Gsm8kDataError(f"{path}:{lineno}: expected an object with question and answer")
            rows.append(row)
    return rows


def load(data_dir: str | None, num_shots: int) -> Dataset:
    if data_dir is None:
        base, origin = PACKAGED_DIR, "packaged"
        train_candidates = ["train_shots.jsonl"]
    else:
        base = Path(data_dir).expanduser()
        origin = str(base)
        train_candidates = ["train.jsonl", "train_shots.jsonl"]
    test_path = base / "test.jsonl"
    if not test_path.is_file():
        raise Gsm8kDataError(f"{test_path} not found — fix: gate.gsm8k.data_dir must name a directory with "
                             "test.jsonl and train.jsonl (or leave it unset for the packaged copy)")
    train_path = next((base / n for n in train_candidates if (base / n).is_file()), None)
    if train_path is None and num_shots > 0:
        raise Gsm8kDataError(f"no {' or '.join(train_candidates)} in {base} for the few-shot examples")
    test = _read_jsonl(test_path)
    shots = _read_jsonl(train_path, limit=num_shots) if num_shots > 0 and train_path else []
    if len(shots) < num_shots:
        raise Gsm8kDataError(f"{train_path} has {len(shots)} examples, {num_shots} shots were asked for")
    if not test:
        raise Gsm8kDataError(f"{test_path} is empty")
    digest = hashlib.sha256(test_path.read_bytes()).hexdigest()
    return Dataset(test=test, shots=shots, origin=origin, test_sha256=digest)


def few_shot_prefix(shots: list[dict[str, str]]) -> str:
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def build_prompt(prefix: str, question: str) -> str:
    return f"{prefix}Question: {question}\nAnswer:"


def select(total: int, num_questions: int | None, seed: int) -> list[int]:
    """All indices in order, or a fixed-seed sample (sorted, so the order of requests is stable too)."""
    if num_questions is None or num_questions >= total:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), num_questions))


# -- extraction ------------------------------------------------------------------------

def gold_answer(answer: str) -> str:
    """The gold number of a GSM8K answer (the text after ``####``), commas removed."""
    m = _GOLD.search(answer)
    if not m:
        raise Gsm8kDataError(f"answer without '#### <number>': {answer[-80:]!r}")
    return m.group(1).replace(",", "").strip()


def extract_last_number(response: str) -> str | None:
    """The last number in ``response`` (commas removed, sign kept), or None when there is none."""
    text = response.translate(_MINUSES).replace(",", "")
    last: str | None = None
    for m in _NUMBER.finditer(text):
        token = m.group(0)
        if token.startswith("-"):
            before = text[m.start() - 1] if m.start() > 0 else " "
            if before.isalnum() or before in ")]":
                token = token[1:]  # "7-3": subtraction, not a negative three
        last = token.replace("$", "")
    return last


def _lm_eval_normalize(s: str) -> str:
    s = s.replace(",", "").replace("$", "").strip()
    return s[:-1] if s.endswith(".") else s


def extract_strict(response: str) -> str | None:
    m = _STRICT.search(response)
    return _lm_eval_normalize(m.group(1)) if m else None


def extract_flexible(response: str) -> str | None:
    last = None
    for m in _FLEXIBLE.finditer(response):
        last = m.group(1) or m.group(2)
    return _lm_eval_normalize(last) if last is not None else None


def same_number(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    try:
        return Decimal(pred) == Decimal(gold)
    except InvalidOperation:
        return False


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there is no observation."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # The bounds at 0 and n are exactly 0 and 1; say so rather than print 0.9999999999999999.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def score(response: str, gold: str) -> dict[str, Any]:
    pred = extract_last_number(response)
    strict = extract_strict(response)
    flexible = extract_flexible(response)
    return {
        "pred": pred,
        "correct": same_number(pred, gold),
        "strict": strict,
        "strict_correct": strict == gold,
        "flexible": flexible,
        "flexible_correct": flexible == gold,
    }


# -- the run ---------------------------------------------------------------------------

async def evaluate(client: Client, cfg: Gsm8kConfig, *, model: str,
                   on_progress: Callable[[], None] | None = None,
                   on_start: Callable[[int], None] | None = None) -> tuple[str, str, dict[str, Any]]:
    """Run the questions and score them. Returns (status, reason, metrics)."""
    import asyncio

    data = load(cfg.data_dir, cfg.num_shots)
    indices = select(len(data.test), cfg.num_questions, cfg.seed)
    prefix = few_shot_prefix(data.shots)
    if on_start:
        on_start(len(indices))

    async def one(i: int) -> dict[str, Any]:
        row = data.test[i]
        gold = gold_answer(row["answer"])
        payload = {"model": model, "prompt": build_prompt(prefix, row["question"]),
                   "max_tokens": cfg.max_tokens, "temperature": 0.0, "stop": STOP}
        try:
            text, ntok = await client.complete(payload)
            out = {"i": i, "gold": gold, "tokens": ntok, **score(text, gold)}
            out["_response"] = text
        except RequestFailed as exc:
            out = {"i": i, "gold": gold, "tokens": 0, "pred": None, "correct": False, "strict": None,
                   "strict_correct": False, "flexible": None, "flexible_correct": False,
                   "error": str(exc)}
        if on_progress:
            on_progress()
        return out

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in indices))
    latency = time.perf_counter() - t0

    n = len(results)
    correct = sum(r["correct"] for r in results)
    errors = [r for r in results if "error" in r]
    lo, hi = wilson_interval(correct, n)
    accuracy = correct / n
    out_tokens = sum(r["tokens"] for r in results)
    wrong_responses = [{"i": r["i"], "gold": r["gold"], "pred": r["pred"], "response": r["_response"][:600]}
                       for r in results if not r["correct"] and "_response" in r][:_KEEP_RESPONSES]
    samples = [{k: v for k, v in r.items() if k != "_response"} for r in results]
    metrics: dict[str, Any] = {
        "accuracy": accuracy,
        "correct": correct,
        "num_questions": n,
        "wilson95": [lo, hi],
        "strict_accuracy": sum(r["strict_correct"] for r in results) / n,
        "flexible_accuracy": sum(r["flexible_correct"] for r in results) / n,
        "invalid_rate": sum(r["pred"] is None for r in results) / n,
        "threshold": cfg.threshold,
        "tolerance": cfg.tolerance,
        "pass_floor": cfg.pass_floor,
        "request_errors": len(errors),
        "first_error": errors[0]["error"] if errors else None,
        "latency_s": latency,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / latency if latency > 0 else None,
        "num_shots": cfg.num_shots,
        "max_tokens": cfg.max_tokens,
        "seed": cfg.seed,
        "subset": cfg.num_questions is not None and n < len(data.test),
        "data": {"origin": data.origin, "test_sha256": data.test_sha256, "test_size": len(data.test)},
        "samples": samples,
        "wrong_responses": wrong_responses,
    }
    if len(errors) == n:
        return "error", f"all {n} requests failed: {errors[0]['error']}", metrics
    floor = cfg.pass_floor
    assert floor is not None  # config guarantees a threshold whenever GSM8K is enabled
    passed = accuracy >= floor - 1e-12  # a float floor may land a hair above the intended one
    summary = (f"accuracy {accuracy:.3f} (95% CI {lo:.3f}–{hi:.3f}, {correct}/{n}) "
               f"{'≥' if passed else '<'} {cfg.threshold:g} − {cfg.tolerance:g} = {floor:.3f}")
    if errors:
        summary += f"; {len(errors)} request(s) failed and count as wrong"
    return ("pass" if passed else "fail"), summary, metrics
