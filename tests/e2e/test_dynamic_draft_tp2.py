"""dynamic-draft at TP=2 on real vLLM (CPU, gloo): drafts sampled from vocabulary shards (three floats
per row exchanged, never the full row) give the same greedy outputs as TP=1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent
TRAINED = HERE.parents[1] / "models" / "tiny-qwen3next-trained"


def _run(tmp_path: Path, tp: int) -> tuple[dict, str]:
    out = tmp_path / f"tp{tp}.json"
    env = dict(os.environ, RADIANCE_ENABLE="1", RADIANCE_DYNAMIC_DRAFT="1",
               VLLM_CPU_OMP_THREADS_BIND="0|1" if tp == 2 else "0")
    proc = subprocess.run([sys.executable, str(HERE / "run_greedy.py"), str(TRAINED), str(out), "--k", "8",
                           "--tp", str(tp)], env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return json.loads(out.read_text()), log


def test_tp2_local_vocab_equals_tp1(tmp_path):
    if not (TRAINED / "model.safetensors").exists():
        pytest.skip("trained tiny model not present")
    tp1, _ = _run(tmp_path, 1)
    tp2, log = _run(tmp_path, 2)
    assert "dynamic-draft samples drafts from vocabulary shards (TP=2" in log, log[-3000:]
    assert "latched off" not in log and "runs stock MTP" not in log, log[-3000:]
    assert tp2["token_ids"] == tp1["token_ids"]
    # The draft counts need not repeat, not even TP=1 against itself (55 drafts in one CI run, 53
    # in the next, same inputs): the engine core steps in its own process while requests are
    # still arriving, so batch composition varies with load, and the schedule's forward cap
    # depends on the batch size. The outputs cannot vary: the target verifies every token.
    print(f"[dynamic-draft tp2] TP=1 {tp1['metrics']} / TP=2 {tp2['metrics']}")
    drafts1, drafts2 = (m["vllm:spec_decode_num_drafts"] for m in (tp1["metrics"], tp2["metrics"]))
    acc1, acc2 = (m["vllm:spec_decode_num_accepted_tokens"] for m in (tp1["metrics"], tp2["metrics"]))
    assert drafts2 > 0 and abs(drafts2 - drafts1) <= 0.1 * drafts1
    assert abs(acc2 - acc1) <= 0.1 * acc1
