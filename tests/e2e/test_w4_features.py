"""w4-drafter and int4-head on real vLLM (CPU) with the trained tiny Qwen3-Next.

w4-drafter is draft-side: greedy outputs must equal stock MTP exactly. int4-head is target-side:
it changes numerics, so its agreement with stock is measured and reported, and it must load,
convert (log lines) and serve without a crash.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRAINED = REPO / "models" / "tiny-qwen3next-trained"


def run(tmp_path: Path, tag: str, **knobs: str) -> tuple[dict, str]:
    out = tmp_path / f"{tag}.json"
    env = dict(os.environ, RADIANCE_ENABLE="1", **knobs)
    proc = subprocess.run([sys.executable, str(HERE / "run_greedy.py"), str(TRAINED), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return json.loads(out.read_text()), log


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    if not (TRAINED / "model.safetensors").exists():
        pytest.skip("trained tiny model not present")
    return run(tmp_path_factory.mktemp("stock"), "stock")


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    same = total = 0
    for x, y in zip(a, b):
        total += len(x)
        for i, (p, q) in enumerate(zip(x, y)):
            if p != q:
                break
            same += 1
    return same / total


def test_w4_drafter_converts_and_is_lossless(stock, tmp_path):
    base, _ = stock
    got, log = run(tmp_path, "w4", RADIANCE_W4_DRAFTER="1")
    assert "w4-drafter declined" not in log and "declined w4_drafter" not in log, log[-3000:]
    assert "w4-drafter converted" in log, log[-3000:]
    assert got["token_ids"] == base["token_ids"]
    print(f"\nw4-drafter: greedy outputs identical to stock MTP on {len(base['token_ids'])} prompts; "
          f"acceptance {got['metrics']} vs stock {base['metrics']}")


def test_int4_head_converts_serves_and_reports_agreement(stock, tmp_path):
    base, _ = stock
    got, log = run(tmp_path, "int4", RADIANCE_INT4_HEAD="1")
    assert "int4-head declined" not in log and "declined int4_head" not in log, log[-3000:]
    assert "int4-head:" in log and "-> 4-bit" in log, log[-3000:]
    assert all(len(t) == 32 for t in got["token_ids"])
    agree = _agreement(base["token_ids"], got["token_ids"])
    exact = sum(a == b for a, b in zip(base["token_ids"], got["token_ids"]))
    print(f"\nint4-head: greedy prefix agreement with stock {agree:.1%}, {exact}/{len(got['token_ids'])} "
          "outputs identical")
