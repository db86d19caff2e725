"""`radiance bench --acceptance synthetic:... --rounds N`: vLLM's synthetic rejection sampler for dummy weights,
and rounds interleaved across sets, each ratio taken within its round, the median and the spread reported."""
import json

import pytest
from click.testing import CliRunner

from launcher import engine_args
from launcher.bench import plan, worker_extension, rounds, run
from launcher.cli import cli
from launcher.commands._common import load
from launcher.profile import Profile

PROFILE = "profiles/qwen3.5-27b-dummy-tp1.yaml"
# the per-position rates issue 37 quotes for a published Qwen 27B MTP measurement (mean acceptance length 3.2)
HIGH = [0.763, 0.623, 0.459, 0.396]


def test_rates_parse_and_bad_ones_name_the_form():
    assert rounds.parse_acceptance("synthetic:0.763,0.623,0.459,0.396") == HIGH
    for bad, needle in [("0.7,0.6", "synthetic:R1"), ("synthetic:", "synthetic:R1"), ("synthetic:a,b", "synthetic:R1"),
                        ("synthetic:0.5,0.7", "must not increase"), ("synthetic:1.2", r"\[0, 1\]")]:
        with pytest.raises(ValueError, match=needle):
            rounds.parse_acceptance(bad)


def test_synthetic_rates_reach_the_speculative_config_and_nothing_else_changes():
    cfg = engine_args.from_profile(load(PROFILE), platform="cuda")
    args = rounds.with_synthetic_acceptance(cfg.server_args, HIGH)
    i = args.index("--speculative-config")
    spec = json.loads(args[i + 1])
    assert spec["rejection_sample_method"] == "synthetic" and spec["synthetic_acceptance_rates"] == HIGH
    assert spec["method"] == "mtp" and spec["num_speculative_tokens"] == 4
    assert args[:i + 1] + args[i + 2:] == cfg.server_args[:i + 1] + cfg.server_args[i + 2:]
    # a shallower drafter gets the first positions: the rates are unconditional
    two = rounds.with_synthetic_acceptance(["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}'],
                                           HIGH)
    assert json.loads(two[1])["synthetic_acceptance_rates"] == HIGH[:2]
    with pytest.raises(ValueError, match="one per position"):
        rounds.with_synthetic_acceptance(cfg.server_args, HIGH[:3])
    with pytest.raises(ValueError, match="needs a drafter"):
        rounds.with_synthetic_acceptance(["--model", "x"], HIGH)


def _set(name, plugin, toks, error=False):
    if error:
        return {"set": name, "plugin": plugin, "runner": "v1", "error": "engine died"}
    return {"set": name, "plugin": plugin, "runner": "v1",
            "results": [{"batch": b, "decode_tok_s": t} for b, t in toks.items()]}


def test_ratios_are_taken_within_a_round_and_the_median_row_is_a_measured_one():
    # the machine is 20% faster in round 2: within-round ratios stay 1.10, cross-round ones would not
    done = [[_set("stock", False, {1: 100.0, 8: 500.0}), _set("all", True, {1: 110.0, 8: 550.0})],
            [_set("stock", False, {1: 120.0, 8: 600.0}), _set("all", True, {1: 132.0, 8: 660.0})],
            [_set("stock", False, {1: 110.0, 8: 550.0}), _set("all", True, {1: 110.0, 8: 605.0})]]
    for r in done:
        run.compare(r)
    merged = rounds.merge_rounds(done)
    all_b1 = next(r for r in merged[1]["results"] if r["batch"] == 1)
    assert all_b1["decode_tok_s"] == 110.0  # median of 110, 132, 110
    assert all_b1["decode_tok_s_spread"] == {"median": 110.0, "min": 110.0, "max": 132.0, "n": 3}
    assert all_b1["vs_stock"] == 1.1 and all_b1["vs_stock_spread"]["min"] == 1.0
    assert all_b1["vs_stock_spread"]["max"] == 1.1 and len(merged[1]["rounds"]) == 3
    stock_b8 = next(r for r in merged[0]["results"] if r["batch"] == 8)
    assert stock_b8["vs_stock"] == 1.0 and stock_b8["decode_tok_s_spread"]["n"] == 3


def test_a_round_whose_engine_failed_is_left_out_of_that_sets_median():
    done = [[_set("stock", False, {1: 100.0}), _set("all", True, {1: 90.0})],
            [_set("stock", False, {1: 100.0}), _set("all", True, {}, error=True)]]
    for r in done:
        run.compare(r)
    merged = rounds.merge_rounds(done)
    assert merged[1]["results"][0]["decode_tok_s_spread"]["n"] == 1
    assert merged[1]["results"][0]["vs_stock"] == 0.9


@pytest.mark.parametrize("raw,needle", [("synthetic:0.9,0.8", "one rate per position"),
                                        ("0.9", "synthetic:R1")])
def test_bad_acceptance_is_a_usage_error_before_any_engine(raw, needle):
    res = CliRunner().invoke(cli, ["bench", PROFILE, "--platform", "cuda", "--acceptance", raw])
    assert res.exit_code == 2, res.output
    assert needle in res.output


def test_synthetic_acceptance_is_refused_on_cpu_where_vllm_asserts_it_away():
    # measured: vLLM 0.32 CPU's sampler fails the engine's first step ("Synthetic acceptance not supported
    # with CPU sampling")
    res = CliRunner().invoke(cli, ["bench", "profiles/tiny-cpu.yaml", "--platform", "cpu",
                                   "--acceptance", "synthetic:0.9,0.5"])
    assert res.exit_code == 2, res.output
    assert "GPUs only" in res.output


def test_ratios_are_taken_within_one_acceptance_profile():
    # one engine per set runs every profile: stock at 0.9 acceptance is not the reference of a row at 0.5
    def rows(pairs):
        return [{"batch": 8, "acceptance": a, "decode_tok_s": t} for a, t in pairs]
    done = [{"set": "stock", "plugin": False, "runner": "v1", "results": rows([("0.9", 200.0), ("0.5", 100.0)])},
            {"set": "all", "plugin": True, "runner": "v1", "results": rows([("0.9", 220.0), ("0.5", 90.0)])}]
    run.compare(done)
    assert [r["vs_stock"] for r in done[1]["results"]] == [1.1, 0.9]
    merged = rounds.merge_rounds([done, done])
    assert [(r["acceptance"], r["decode_tok_s_spread"]["n"]) for r in merged[1]["results"]] == [("0.9", 2), ("0.5", 2)]


def test_acceptance_profiles_after_the_first_need_the_switching_extension():
    args = worker_extension.with_extension(["--model", "x"])
    assert args[-2:] == ["--worker-extension-cls", "launcher.bench.worker_extension.BenchWorkerExtension"]
    with pytest.raises(ValueError, match="already"):
        worker_extension.with_extension(args)
    assert rounds.acceptance_label([0.908, 0.5, 0.0, 0.0]) == "0.908/0.5/0/0"


def test_every_acceptance_profile_is_checked_before_any_engine():
    res = CliRunner().invoke(cli, ["bench", PROFILE, "--platform", "cuda", "--acceptance", "synthetic:0.9,0.8,0.7,0.6",
                                   "--acceptance", "synthetic:0.5,0.6,0.1,0.1"])
    assert res.exit_code == 2, res.output
    assert "must not increase" in res.output


def test_ratios_are_to_stock_on_the_runner_vllm_picks_where_it_ran():
    # on a GPU vLLM 0.32 picks Model Runner V2: a user's `vllm serve` is stock@v2, so that is the reference
    # even though the plugin's sets run V1; without it (a CPU, or --sets without stock@v2) stock V1 is
    v1 = _set("stock", False, {8: 100.0})
    v2 = {**_set("stock@v2", False, {8: 125.0}), "runner": "v2"}
    feat = _set("only-int4_head", True, {8: 120.0})
    both = [v1, v2, feat]
    assert run.compare(both) == "stock@v2"
    assert feat["results"][0]["vs_stock"] == 0.96 and v1["results"][0]["vs_stock"] == 0.8
    only_v1 = [_set("stock", False, {8: 100.0}), _set("only-int4_head", True, {8: 120.0})]
    assert run.compare(only_v1) == "stock" and only_v1[1]["results"][0]["vs_stock"] == 1.2
    failed_v2 = [{**v2, "error": "engine died"}, _set("stock", False, {8: 100.0}), _set("x", True, {8: 90.0})]
    assert run.compare(failed_v2) == "stock" and failed_v2[2]["results"][0]["vs_stock"] == 0.9


@pytest.mark.parametrize("extra,needle", [
    (["--sets", "only-int4_head,stock@v2"], "must be stock or stock@v2"),
    (["--sets", "stock@v2"], "must be stock or stock@v2"),
    (["--sets", "stock@v2,only-int4_head"], "gpu-memory-utilization=0.47"),   # the profile's 0.9
])
def test_keep_reference_needs_stock_first_and_room_for_two_engines(extra, needle):
    res = CliRunner().invoke(cli, ["bench", PROFILE, "--platform", "cuda", "--keep-reference", *extra])
    assert res.exit_code == 2, res.output
    assert needle in res.output


def test_b1_ratio_at_expected_acceptance_leaves_the_seeded_samplers_luck_out():
    # measured on the H100 (2026-12-06): stock@v2 drew 4.33 tokens a step every round at rates expecting 4.16,
    # a V1 set 3.88: its tok/s ratio was 0.91 though its steps were 4% faster
    rates = "0.908/0.824/0.748/0.679"
    stock = {"set": "stock@v2", "plugin": False, "runner": "v2", "depth": 4, "results": [
        {"batch": 1, "acceptance": rates, "decode_tok_s": 161.6, "ms_per_step": 27.85},
        {"batch": 8, "acceptance": rates, "decode_tok_s": 879.3, "ms_per_step": 38.53}]}
    feat = {"set": "only-int4_head", "plugin": True, "runner": "v1", "depth": 4, "results": [
        {"batch": 1, "acceptance": rates, "decode_tok_s": 147.0, "ms_per_step": 26.79},
        {"batch": 8, "acceptance": rates, "decode_tok_s": 1118.6, "ms_per_step": 30.81}]}
    for s in (stock, feat):
        rounds.add_expected(s)
    run.compare([stock, feat])
    b1, b8 = feat["results"]
    assert b1["expected_acceptance_length"] == 4.159 and b1["vs_stock"] == 0.91
    assert b1["vs_stock_expected"] == round(27.85 / 26.79, 3)
    assert "vs_stock_expected" not in b8 and "expected_acceptance_length" not in b8  # B > 1: the straggler's luck


def test_expected_length_follows_the_depths_dynamic_draft_chose():
    rates = [0.5, 0.25, 0.125, 0.0625]
    assert rounds.expected_length(rates, 4) == 1.9375
    counters = {"radiance:draft_depth_steps_total{depth=4}": 3.0, "radiance:draft_depth_steps_total{depth=1}": 1.0,
                "radiance:draft_steps_total": 4.0}
    assert rounds.expected_length(rates, 4, counters) == (3 * 1.9375 + 1.5) / 4


def test_each_round_after_the_first_starts_its_engines_with_another_seed(tmp_path):
    # vLLM's synthetic sampler draws from the global generator seeded at start: the same seed in every
    # round repeats each engine's draws (H100, 2026-12-06: stock@v2's B = 1 acceptance length 4.333 three times)
    profile = load(PROFILE)
    fs = next(iter(plan.parse("stock@v2", profile, "cuda")))
    opts = run.Options(batches=[1], max_tokens=8, acceptance=[HIGH])
    first = run._engine(fs, profile, "cuda", opts, tmp_path)
    third = run._engine(fs, profile, "cuda", opts, tmp_path, seed_offset=2)
    assert "--seed" not in first.job["server_args"] and third.job["server_args"][-2:] == ["--seed", "2"]
    seeded = Profile.model_validate({**profile.model_dump(), "vllm_args": {**profile.vllm_args, "seed": 40}})
    assert run._engine(fs, seeded, "cuda", opts, tmp_path, seed_offset=2).job["server_args"][-2:] == ["--seed", "42"]
    assert run._annotate({"set": fs.name, "results": []}, third)["seed"] == 2


def test_a_round_cut_short_counts_for_the_sets_it_reached_each_against_its_own_rounds_stock():
    # the device's time ran out in round 3 after stock and "dd": round 3 still holds a within-round ratio
    # for dd (to round 3's stock), none for "w4", which ran in two rounds
    def rnd(stock, dd, w4=None):
        r = [_set("stock", False, {8: stock}), _set("dd", True, {8: dd})]
        return r + ([_set("w4", True, {8: w4})] if w4 is not None else [])
    done = [rnd(100.0, 110.0, 101.0), rnd(100.0, 112.0, 99.0), rnd(80.0, 96.0)]
    merged, ref, complete = run.merge_done(done)
    assert ref == "stock" and complete == 2
    dd, w4 = merged[1]["results"][0], merged[2]["results"][0]
    assert dd["vs_stock_spread"] == {"median": 1.12, "min": 1.1, "max": 1.2, "n": 3}
    assert w4["vs_stock_spread"]["n"] == 2 and len(merged[2]["rounds"]) == 2
    assert merged[0]["results"][0]["decode_tok_s_spread"]["n"] == 3


def test_both_tables_name_a_set_that_ran_in_fewer_rounds(monkeypatch, tmp_path):
    import io
    import subprocess
    import sys

    from rich.console import Console

    from launcher import console
    from launcher.commands import bench as bench_cmd

    done = [[_set("stock", False, {8: 100.0}), _set("dd", True, {8: 110.0})],
            [_set("stock", False, {8: 100.0}), _set("dd", True, {8: 112.0})],
            [_set("stock", False, {8: 90.0})]]
    for rnd in done:
        for s in rnd:
            for r in s["results"]:
                r.update(ms_per_step=10.0, mean_acceptance_length=2.0)
    merged, ref, complete = run.merge_done(done)
    report = {"profile_name": "p", "device": "d", "commit": "c", "reference": ref,
              "options": {"max_tokens": 8, "rounds": 3, "rounds_done": complete}, "acceptance": {"kind": "model"},
              "sets": merged}
    buf = io.StringIO()
    monkeypatch.setattr(console, "out", Console(file=buf, width=250, color_system=None))
    bench_cmd._table(report)
    lines = buf.getvalue().splitlines()
    assert any("dd (2 of 3 rounds)" in x for x in lines) and not any("stock (" in x for x in lines)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    md = subprocess.run([sys.executable, "benchmarks/report_table.py", str(path)], capture_output=True, text=True,
                        check=True).stdout
    assert "| dd (2 of 3 rounds) |" in md and "| stock |" in md


def test_a_kept_reference_report_pairs_each_set_with_the_reference_measured_beside_it(tmp_path):
    # --keep-reference: stock measured before each of the set's measurements; the machine halves its speed
    # before "w4" starts. w4's ratio is to stock's 3rd and 4th measurements, not its 1st and 2nd (0.55x)
    import subprocess
    import sys

    stock = [_set("stock@v2", False, {8: t}) for t in (100.0, 100.0, 50.0, 50.0)]
    for s in stock:
        s["runner"] = "v2"
    pairs = {"int4": [[stock[0], _set("int4", True, {8: 110.0})], [stock[1], _set("int4", True, {8: 112.0})]],
             "w4": [[stock[2], _set("w4", True, {8: 55.0})], [stock[3], _set("w4", True, {8: 56.0})]]}
    merged = run.merge_pairs(pairs)
    assert [s["set"] for s in merged] == ["stock@v2", "int4", "w4"]
    assert merged[2]["results"][0]["vs_stock_spread"] == {"median": 1.11, "min": 1.1, "max": 1.12, "n": 2}
    assert merged[0]["results"][0]["decode_tok_s_spread"]["n"] == 4
    assert run.split_pairs(merged) == pairs
    for rnd in (p for ps in pairs.values() for p in ps):
        for s in rnd:
            s["results"][0].update(ms_per_step=10.0, mean_acceptance_length=2.0)
    report = {"profile_name": "p", "device": "d", "commit": "c", "reference": "stock@v2",
              "acceptance": {"kind": "model"},
              "options": {"max_tokens": 8, "rounds": 2, "rounds_done": 2, "keep_reference": True},
              "sets": run.merge_pairs(pairs)}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    md = subprocess.run([sys.executable, "benchmarks/report_table.py", str(path)], capture_output=True, text=True,
                        check=True).stdout
    assert "| w4 |  | 8 | 55 [55-56] | 1.11 [1.10-1.12] |" in md and "| stock@v2 |  | 8 |" in md and "rounds)" not in md
