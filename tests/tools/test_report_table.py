"""benchmarks/report_table.py's second table: dynamic-draft against the best fixed depth of the same report,
read from a committed raw result (docs/benchmarks.md, fifteenth session, quotes it)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
S15 = ROOT / "benchmarks/results/vllm_27b_shape_h100_2026-12-06_s15_dynamic_draft_v2_fixed_depths.json"


def _module():
    spec = importlib.util.spec_from_file_location("report_table", ROOT / "benchmarks/report_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_depth_table_names_the_best_fixed_depth_per_cell_and_the_depths_the_policy_ran():
    table = _module().depth_table(json.loads(S15.read_text()))
    rows = [line for line in table.splitlines() if line.startswith("| only-dynamic_draft")]
    assert len(rows) == 9
    cells = {tuple(c.strip() for c in r.split("|")[2:4]): [c.strip() for c in r.split("|")[1:-1]] for r in rows}
    header = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]]
    assert len(header) == len(rows[0].split("|")) - 2 == len(table.splitlines()[1].split("|")) - 2
    prose_32 = dict(zip(header, cells[("0.492/0.242/0.119/0.058", "32")]))
    assert prose_32["best fixed"] == "k1" and prose_32["vs best fixed"] == "0.92" and prose_32["vs stock"] == "1.06"
    assert prose_32["depths run (steps)"] == "1: 5, 2: 5, 3: 32, 4: 6"
    code_1 = dict(zip(header, cells[("0.908/0.824/0.748/0.679", "1")]))
    assert code_1["best fixed"] == "k4" and code_1["dynamic-draft [spread]"] == "160 [142-192]"


def test_a_report_without_fixed_depths_has_no_depth_table():
    report = json.loads(S15.read_text())
    report["sets"] = [s for s in report["sets"] if s["set"] in ("stock", "only-dynamic_draft")]
    assert _module().depth_table(report) is None


S21 = ROOT / "benchmarks/results/vllm_27b_shape_h100_2026-12-07_s21_take_turns_each_feature.json"
CODE = "0.908/0.824/0.748/0.679"


def test_drop_leaves_out_one_rounds_rows_at_one_profile_and_the_medians_follow():
    """The twenty-first session's first round ran its code-like rows at acceptance 0 (the synthetic rates were
    lost over vLLM's level-2 sleep): stock's B = 1 ran 39 tok/s there against 147-153 in the other rounds."""
    mod = _module()
    report = json.loads(S21.read_text())

    def stock_code_b1(rep):
        stock = mod.rederive(rep)[0]
        return next(r for r in stock["results"] if r["acceptance"] == CODE and r["batch"] == 1)

    assert stock_code_b1(report)["decode_tok_s_spread"]["min"] < 40
    kept = stock_code_b1(mod.drop_rows(report, [(1, CODE)]))
    assert kept["decode_tok_s_spread"]["min"] > 140 and kept["decode_tok_s_spread"]["n"] == 2
    # the other profiles keep their three rounds, and the raw report is not touched
    prose = next(r for r in mod.rederive(mod.drop_rows(report, [(1, CODE)]))[0]["results"]
                 if r["acceptance"] != CODE and r["batch"] == 1)
    assert prose["decode_tok_s_spread"]["n"] == 3
    assert len(report["sets"][0]["rounds"][0]["results"]) == 9


def test_drop_refuses_a_pair_that_matches_no_row():
    report = json.loads(S21.read_text())
    try:
        _module().drop_rows(report, [(1, "0.9/0.8")])
    except ValueError as exc:
        assert "no set has rows of round 1" in str(exc)
    else:
        raise AssertionError("a --drop matching nothing passed")
