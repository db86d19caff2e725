"""benchmarks/step_split.py: a timed run's decode time per step, split into the engine's wait on the GPU and
the host's share, read from a committed raw result and the per-step lines beside it (docs/benchmarks.md,
twenty-third session, quotes it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import step_split   # a namespace package: the repository's root is on pytest's path

ROOT = Path(__file__).resolve().parents[2]
S23 = ROOT / "benchmarks/results/vllm_27b_shape_h100_2026-12-07_s23_dynamic_draft_jit_warmup.json"
CODE = "0.908/0.824/0.748/0.679"


def test_the_split_of_the_committed_table_is_what_the_docs_quote():
    rows = {(r["set"], r["acceptance"], r["batch"]): r for r in step_split.split(*step_split.load(S23))}
    assert len(rows) == 12 and all(r["rounds"] == 4 for r in rows.values())
    stock, dd = rows[("stock", CODE, 8)], rows[("only-dynamic_draft", CODE, 8)]
    assert (stock["wait_ms"], stock["host_ms"], stock["total_ms"]) == (20.0, 6.3, 26.3)
    assert (dd["wait_ms"], dd["host_ms"], dd["total_ms"]) == (18.7, 9.7, 28.4)
    for r in rows.values():   # the two shares add up to the whole, per step
        assert r["wait_ms"] + r["host_ms"] == pytest.approx(r["total_ms"], abs=0.11)


def test_a_cell_logged_out_of_step_with_the_report_is_refused():
    report, cells = step_split.load(S23)
    cells["stock"] = cells["stock"][1:]
    with pytest.raises(ValueError, match="stock: 24 rows in the report, 23 cells"):
        step_split.split(report, cells)
    report["options"]["repeat"] = 3
    with pytest.raises(ValueError, match="--repeat 1"):
        step_split.split(report, step_split.load(S23)[1])


def test_the_timed_run_is_the_second_of_a_cell():
    untimed, timed, first_token = [(3, 0.1), (0, 20.0), (0, 19.0)], [(3, 0.1), (5, 0.1), (0, 18.0)], [(8, 0.1)]
    assert step_split.timed_run(untimed + timed + first_token) == timed
    with pytest.raises(ValueError):
        step_split.timed_run([(8, 0.1)])


def test_the_command_prints_a_table_and_json(capsys):
    assert step_split.main([str(S23)]) == 0
    assert f"| only-dynamic_draft | {CODE} | 8 | 4 | 18.7 | 9.7 | 28.4 |" in capsys.readouterr().out
    assert step_split.main([str(S23), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 12
    assert step_split.main([str(ROOT / "benchmarks/results/nothing.json")]) == 2
