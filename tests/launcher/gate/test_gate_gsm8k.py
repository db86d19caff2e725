"""GSM8K extraction, scoring, prompt format and data loading (no server)."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from launcher.gate import gsm8k
from launcher.gate.gsm8k import (extract_flexible, extract_last_number, extract_strict, gold_answer, same_number,
                                 score, wilson_interval)

PACKAGED = gsm8k.PACKAGED_DIR
# launcher/data/gsm8k/SOURCE.md: the upstream files these are, byte for byte.
TEST_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
SHOTS_SHA256 = "5cf05b0ccca50349f5f5185a439502ec50117d1021ec7dfce2f09dd2083f9a25"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _assert_extracts_gold(rows: list[dict]) -> None:
    wrong = [(i, r["answer"][-60:]) for i, r in enumerate(rows)
             if extract_last_number(r["answer"]) != gold_answer(r["answer"])]
    assert not wrong, f"{len(wrong)} answers mis-extracted, first: {wrong[:3]}"


def test_extractor_returns_gold_for_all_packaged_test_answers():
    rows = _rows(PACKAGED / "test.jsonl")
    assert len(rows) == 1319
    _assert_extracts_gold(rows)
    _assert_extracts_gold(_rows(PACKAGED / "train_shots.jsonl"))
    # The negative gold answers are the ones the upstream \d+ extractor can never score.
    assert sum(gold_answer(r["answer"]).startswith("-") for r in rows) == 2


def test_strict_and_flexible_return_gold_for_all_answers():
    for r in _rows(PACKAGED / "test.jsonl") + _rows(PACKAGED / "train_shots.jsonl"):
        gold = gold_answer(r["answer"])
        assert extract_strict(r["answer"]) == gold
        assert extract_flexible(r["answer"]) == gold


def test_packaged_copy_is_the_documented_file():
    """Pinned to upstream's bytes (SOURCE.md), wherever the repository is checked out."""
    assert hashlib.sha256((PACKAGED / "test.jsonl").read_bytes()).hexdigest() == TEST_SHA256
    assert hashlib.sha256((PACKAGED / "train_shots.jsonl").read_bytes()).hexdigest() == SHOTS_SHA256
    source = (PACKAGED / "SOURCE.md").read_text()
    assert TEST_SHA256 in source and SHOTS_SHA256 in source
    assert (PACKAGED / "LICENSE").is_file()


@pytest.mark.parametrize("response, expected", [
    ("She has 7 - 10 = -3 apples left.\n#### -3", "-3"),
    ("The temperature fell to -12 degrees.", "-12"),
    ("x = -3", "-3"),
    ("The loss is \u22127 dollars.", "-7"),            # unicode minus sign
    ("He paid $-5 in fees", "-5"),
    ("7-3 = 4", "4"),
    ("(5)-3", "3"),                                   # subtraction after a bracket, not a sign
    ("it costs 10-3", "3"),
    ("The total is $1,250,000.", "1250000"),
    ("1,000 + 2,500 = 3,500", "3500"),
    ("She needs 2.5 cups", "2.5"),
    ("It takes 18 minutes. Then she rests for a while, twice.", "18"),
    ("#### 42\n\nThe next question is about 3 apples", "3"),  # the last number wins, as upstream
    ("Answer: 15.", "15"),
    ("no number at all", None),
    ("", None),
])
def test_last_number_extraction(response, expected):
    assert extract_last_number(response) == expected


@pytest.mark.parametrize("response, gold, correct", [
    ("#### -3", "-3", True),
    ("The answer is 18.00", "18", True),
    ("The answer is 1,450,000", "1450000", True),
    ("The answer is 17", "18", False),
    ("I do not know", "18", False),
    ("3 apples... so 18 in total, done", "18", True),
])
def test_score_main(response, gold, correct):
    assert score(response, gold)["correct"] is correct


@pytest.mark.parametrize("response, strict, flexible", [
    ("Step 1 = 4.\n#### 1,234", "1234", "1234"),
    ("#### -5.", "-5", "-5"),
    ("#### $12", None, "12"),                 # strict wants a digit or "-" right after "#### "
    ("So the answer is 12.", None, "12"),
    ("First #### 3 then #### 4", "3", "4"),   # strict takes the first, flexible the last
    ("nothing here", None, None),
])
def test_lm_eval_strict_and_flexible(response, strict, flexible):
    assert extract_strict(response) == strict
    assert extract_flexible(response) == flexible


def test_same_number_tolerates_formats_only():
    assert same_number("18.0", "18")
    assert not same_number("18.5", "18")
    assert not same_number(None, "18")
    assert not same_number("1.2.3", "18")


def _wilson_by_quadratic(k: int, n: int, z: float) -> tuple[float, float]:
    # Roots in p of (p̂ − p)² = z² p (1 − p) / n — the definition, solved independently of the code.
    ph = k / n
    a = 1 + z * z / n
    b = -(2 * ph + z * z / n)
    c = ph * ph
    disc = math.sqrt(b * b - 4 * a * c)
    return (-b - disc) / (2 * a), (-b + disc) / (2 * a)


@pytest.mark.parametrize("k, n", [(85, 100), (1, 10), (1100, 1319), (5, 7), (50, 50), (0, 20)])
def test_wilson_interval_matches_definition(k, n):
    lo, hi = wilson_interval(k, n)
    want_lo, want_hi = _wilson_by_quadratic(k, n, gsm8k.Z95)
    assert lo == pytest.approx(max(0.0, want_lo), abs=1e-12)
    assert hi == pytest.approx(min(1.0, want_hi), abs=1e-12)


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(85, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.7672, 0.9069)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_prompt_format_is_the_vllm_ci_protocol():
    data = gsm8k.load(None, 5)
    prefix = gsm8k.few_shot_prefix(data.shots)
    prompt = gsm8k.build_prompt(prefix, "What is 2 + 2?")
    first = data.shots[0]
    assert prompt.startswith(f"Question: {first['question']}\nAnswer: {first['answer']}\n\nQuestion: ")
    assert prompt.endswith("\n\nQuestion: What is 2 + 2?\nAnswer:")
    assert prompt.count("Question: ") == 6
    assert gsm8k.STOP == ["Question", "Assistant:", "<|separator|>"]


def test_subset_is_fixed_by_seed_and_sorted():
    a = gsm8k.select(1319, 50, seed=0)
    assert a == gsm8k.select(1319, 50, seed=0) and a == sorted(a) and len(set(a)) == 50
    assert a != gsm8k.select(1319, 50, seed=1)
    assert gsm8k.select(1319, None, seed=0) == list(range(1319))


def test_data_dir_override_and_errors(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "test.jsonl").write_bytes((PACKAGED / "test.jsonl").read_bytes())
    shots = (PACKAGED / "train_shots.jsonl").read_text(encoding="utf-8").splitlines()
    (own / "train.jsonl").write_text("\n".join(shots + shots) + "\n", encoding="utf-8")  # 10 examples
    data = gsm8k.load(str(own), 8)
    assert len(data.shots) == 8 and len(data.test) == 1319 and data.origin == str(own)
    assert data.test_sha256 == TEST_SHA256
    with pytest.raises(gsm8k.Gsm8kDataError, match="has 10 examples, 11 shots"):
        gsm8k.load(str(own), 11)
    with pytest.raises(gsm8k.Gsm8kDataError, match="test.jsonl not found"):
        gsm8k.load(str(tmp_path), 5)
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(gsm8k.Gsm8kDataError, match=r"test.jsonl:2: not JSON"):
        gsm8k.load(str(tmp_path), 1)
