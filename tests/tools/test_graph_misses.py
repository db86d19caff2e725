"""benchmarks/graph_misses.py: which decode steps of the committed tables replayed no full CUDA graph, by
Model Runner V2's own table (docs/benchmarks.md, twenty-sixth session, quotes it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")
from benchmarks import graph_misses  # noqa: E402  (a namespace package: the repository's root is on pytest's path)

ROOT = Path(__file__).resolve().parents[2]
S23 = ROOT / "benchmarks/results/vllm_27b_shape_h100_2026-12-07_s23_dynamic_draft_jit_warmup.json"
CODE, PROSE = "0.908/0.824/0.748/0.679", "0.492/0.242/0.119/0.058"


def _rows(widened=False):
    return {(r["set"], r["acceptance"], r["batch"]): r
            for r in graph_misses.misses(*graph_misses.load(S23), widened=widened)}


def test_the_twenty_third_sessions_dynamic_draft_steps_missed_their_graph_and_stocks_never_did():
    rows = _rows()
    assert len(rows) == 12
    assert all(r["not_full"] == 0 for key, r in rows.items() if key[0] == "stock")
    dd = {(a, b): (r["decode_steps"], r["not_full"]) for (s, a, b), r in rows.items() if s == "only-dynamic_draft"}
    assert dd == {(CODE, 1): (69, 0), (CODE, 8): (78, 2), (CODE, 32): (83, 6),
                  (PROSE, 1): (144, 0), (PROSE, 8): (164, 8), (PROSE, 32): (168, 7)}
    assert rows[("only-dynamic_draft", CODE, 8)]["which"] == ["3x5", "6x5"]   # depth 4 at B = 3 and 6


def test_widened_every_logged_step_finds_a_full_graph():
    assert [key for key, r in _rows(widened=True).items() if r["not_full"]] == []


def test_a_report_without_capture_sizes_is_refused(tmp_path):
    report = json.loads(S23.read_text())
    report["vllm_args"].pop("compilation-config")
    (tmp_path / "r.json").write_text(json.dumps(report))
    for f in S23.parent.glob(S23.stem + ".steps-*.log.gz"):
        (tmp_path / f.name.replace(S23.stem, "r")).write_bytes(f.read_bytes())
    assert graph_misses.main([str(tmp_path / "r.json")]) == 2
