"""`radiance bench`'s exit code and message from its sets' lossless verdicts: violations exit 1, a batch that
scored nothing exits 6 (inconclusive) and is named, unless --allow-inconclusive. The engines are not run:
``run.bench`` returns a report built from real verdicts (launcher.bench.lossless)."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import errors
from launcher.bench import lossless, run
from launcher.cli import cli

REPO = Path(__file__).resolve().parents[3]


def _row(token_lp: dict[int, float]) -> dict[int, tuple[float, int]]:
    ranked = sorted(token_lp.items(), key=lambda kv: -kv[1])
    return {t: (lp, i + 1) for i, (t, lp) in enumerate(ranked)}


GOOD = [_row({4: -0.1, 3: -3.0}), _row({5: -0.1, 9: -3.0})]
OFF = [_row({3: -0.1, 4: -3.0}), _row({9: -0.1, 5: -6.0})]
VERDICTS = {
    "good": lossless.check([[4, 5]], [[GOOD], [GOOD]]),
    "unscorable": lossless.check([[4, 5]], [[OFF], [OFF]]),          # the prefill token off in both passes
    "unstable": lossless.check([[4, 5]], [[GOOD], [OFF]]),           # the passes disagree at every position
    "lossy": lossless.check([[4, 5]], [[GOOD[:1] + OFF[1:]], [GOOD[:1] + OFF[1:]]]),
}


def _report(sets: dict[str, dict[int, str]]) -> dict:
    out = []
    for name, batches in sets.items():
        rows = [{"batch": b, "decode_tok_s": 100.0, "ms_per_step": 1.0, "mean_acceptance_length": None,
                 "lossless": VERDICTS[kind].as_dict()} for b, kind in batches.items()]
        merged = lossless.merge({b: VERDICTS[kind] for b, kind in batches.items()}).as_dict()
        out.append({"set": name, "runner": "v1", "results": rows, "lossless": merged})
    return {"profile_name": "tiny-cpu", "device": "cpu", "commit": "abc", "options": {"max_tokens": 2},
            "acceptance": None, "sets": out}


@pytest.fixture
def bench(monkeypatch, isolated_home, tmp_path):
    from launcher import console

    # the table's verdicts must not wrap: another test in the same process can leave the console narrower
    # than COLUMNS says (seen under xdist in CI)
    monkeypatch.setattr(console.out, "_width", 250)
    monkeypatch.setattr(console.err, "_width", 250)

    def invoke(sets: dict, *extra: str):
        monkeypatch.setattr(run, "bench", lambda *a, **kw: _report(sets))
        return CliRunner().invoke(cli, ["bench", str(REPO / "profiles/tiny-cpu.yaml"), "--sets", "stock",
                                        "--batch", "1,8", "--out", str(tmp_path / "r.json"), *extra],
                                  env={"COLUMNS": "250"},
                                  catch_exceptions=False)
    return invoke


def test_scored_batches_without_violations_exit_0(bench):
    res = bench({"stock": {1: "good", 8: "good"}})
    assert res.exit_code == 0, res.output
    assert "ok (2 scored, 0 ties)" in res.output


@pytest.mark.parametrize("kind,why", [("unscorable", "1 unscorable"), ("unstable", "2 unstable")])
def test_a_batch_that_scored_nothing_exits_6_naming_set_and_batch(bench, kind, why):
    res = bench({"stock": {1: kind, 8: "good"}, "all": {1: "good", 8: "good"}})
    assert res.exit_code == errors.INCONCLUSIVE == 6, res.output
    err = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "inconclusive" in err[0] and "set stock B=1: 0 positions scored" in err[0]
    assert why in err[0] and "all" not in err[0].split("inconclusive", 1)[1].split("(report")[0]
    assert "inconclusive" in res.output.split("error:")[0]      # the table's verdict for B = 1


def test_allow_inconclusive_warns_and_exits_0(bench):
    res = bench({"stock": {1: "unscorable", 8: "good"}}, "--allow-inconclusive")
    assert res.exit_code == 0, res.output
    assert "set stock B=1: 0 positions scored" in res.output and "error:" not in res.output


def test_violations_exit_1_before_inconclusive(bench):
    res = bench({"stock": {1: "unscorable", 8: "good"}, "all": {1: "good", 8: "lossy"}})
    assert res.exit_code == 1, res.output
    assert "set(s) all emitted tokens" in res.output and "set stock B=1" in res.output


def test_the_json_report_counts_unstable_positions(bench, tmp_path):
    res = bench({"stock": {1: "unstable", 8: "good"}}, "--allow-inconclusive", "--json")
    assert res.exit_code == 0, res.output
    ll = json.loads((tmp_path / "r.json").read_text())["sets"][0]["lossless"]
    assert (ll["unstable"], ll["positions"], ll["verdict"], ll["inconclusive_batches"]) == (2, 2, "inconclusive", [1])
