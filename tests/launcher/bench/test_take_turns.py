"""`radiance bench --keep-reference --take-turns`: every engine but the one measured sleeps, so each runs with the
profile's whole memory budget. vLLM's sleep mode exists on CUDA and ROCm only, so here the engines (and, for the
worker's side, the LLM) are fakes: what is checked is the order of turns and what the CLI refuses."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import errors
from launcher.bench import plan, run, worker, worker_extension
from launcher.cli import cli
from launcher.commands import bench as bench_cmd
from launcher.commands._common import load

PROFILE = "profiles/qwen3.5-27b-dummy-tp1.yaml"


class _FakeEngine:
    """Stands for run.Resident (a worker process with a vLLM engine that can sleep): records every turn and
    checks that no two engines are awake on the device at once."""
    log: list[tuple[str, str]] = []
    awake: set[str] = set()
    fail: tuple[str, str] | None = None   # (set, op) that answers an error

    def __init__(self, fs, profile, platform, opts, log_dir):
        assert not _FakeEngine.awake, f"{fs.name} started while {_FakeEngine.awake} held the device"
        self.name, self.error = fs.name, None
        self.e = run._Engine(fs, 4, {}, {"server_args": []}, Path(log_dir) / f"{fs.name}.log", "")
        self.e.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.e.log_path.write_text("fake engine log\n")
        _FakeEngine.awake.add(self.name)
        _FakeEngine.log.append((self.name, "start"))

    def wait_ready(self):
        return True

    def turn(self, op):
        _FakeEngine.log.append((self.name, op))
        if _FakeEngine.fail == (self.name, op):
            self.error = f"{op}: RuntimeError: no sleep mode"
            return None
        (_FakeEngine.awake.discard if op == "sleep" else _FakeEngine.awake.add)(self.name)
        return 1.5

    def measure(self, lossless):
        assert _FakeEngine.awake == {self.name}, f"{self.name} measured beside {_FakeEngine.awake}"
        _FakeEngine.log.append((self.name, "measure"))
        return run._annotate({"set": self.name, "results": [{"batch": 8, "decode_tok_s": 100.0}]}, self.e)

    def close(self):
        _FakeEngine.awake.discard(self.name)
        _FakeEngine.log.append((self.name, "close"))


@pytest.fixture
def fake_engines(monkeypatch):
    monkeypatch.setattr(run, "Resident", _FakeEngine)
    _FakeEngine.log, _FakeEngine.awake, _FakeEngine.fail = [], set(), None
    return _FakeEngine


def _bench(tmp_path, take_turns=True, sets="stock@v2,only-int4_head,only-w4_drafter"):
    profile = load(PROFILE)
    sets = plan.parse(sets, profile, "cuda")
    opts = run.Options(batches=[8], max_tokens=8, rounds=2, keep_reference=True, take_turns=take_turns)
    return run.bench(profile, PROFILE, "cuda", sets, opts, "abc", tmp_path / "logs")


def _visit(name):
    return [(name, "wake"), (name, "measure"), (name, "sleep")]


def test_take_turns_keeps_every_engine_asleep_but_the_one_measured_with_the_gpu_sleep_mode_faked(tmp_path,
                                                                                               fake_engines):
    report = _bench(tmp_path)
    log = fake_engines.log
    # each engine started once, with the device to itself, and put to sleep before the next starts
    assert log[:6] == [("stock@v2", "start"), ("stock@v2", "sleep"), ("only-int4_head", "start"),
                       ("only-int4_head", "sleep"), ("only-w4_drafter", "start"), ("only-w4_drafter", "sleep")]
    # rounds of stock then every set, the sets reversed every other round
    rounds = _visit("stock@v2") + _visit("only-int4_head") + _visit("only-w4_drafter")
    rounds += _visit("stock@v2") + _visit("only-w4_drafter") + _visit("only-int4_head")
    assert log[6:24] == rounds
    assert sorted(log[24:]) == [(n, "close") for n in ("only-int4_head", "only-w4_drafter", "stock@v2")]
    assert report["options"]["take_turns"] is True and report["options"]["rounds_done"] == 2
    sets = {s["set"]: s for s in report["sets"]}
    assert list(sets) == ["stock@v2", "only-int4_head", "only-w4_drafter"]
    # stock measured once a round and counted once, though it is the reference of both sets
    assert len(sets["stock@v2"]["rounds"]) == 2
    assert run.split_pairs(report["sets"], shared_reference=True)["only-w4_drafter"][1][0] is \
        report["sets"][0]["rounds"][1]


def test_take_turns_reports_after_every_pair_so_a_run_cut_short_keeps_it_with_the_gpu_sleep_mode_faked(
        tmp_path, fake_engines):
    profile = load(PROFILE)
    sets = plan.parse("stock@v2,only-int4_head,only-w4_drafter", profile, "cuda")
    opts = run.Options(batches=[8], max_tokens=8, rounds=2, keep_reference=True, take_turns=True)
    saved = []
    run.bench(profile, PROFILE, "cuda", sets, opts, "abc", tmp_path / "logs",
              on_set=lambda r: saved.append(sum(len(s.get("rounds", [])) for s in r["sets"][1:])))
    # one report per measured set, each holding one more pair than the last
    assert saved == [1, 2, 3, 4]


def test_a_set_that_cannot_wake_is_dropped_and_the_others_go_on_with_the_gpu_sleep_mode_faked(tmp_path,
                                                                                              fake_engines):
    fake_engines.fail = ("only-int4_head", "wake")
    report = _bench(tmp_path)
    sets = {s["set"]: s for s in report["sets"]}
    assert "error" not in sets["stock@v2"] and "error" not in sets["only-w4_drafter"]
    assert "wake: RuntimeError: no sleep mode" in sets["only-int4_head"]["error"]
    # closed once it failed, never woken again; the other set measured in both rounds
    log = fake_engines.log
    assert log.count(("only-int4_head", "wake")) == 1 and log.count(("only-w4_drafter", "measure")) == 2
    assert log.index(("only-int4_head", "close")) < log.index(("stock@v2", "wake"), log.index(("only-int4_head",
                                                                                              "wake")))


def test_a_set_that_cannot_sleep_after_starting_is_stopped_before_the_next_starts_with_the_gpu_sleep_mode_faked(
        tmp_path, fake_engines):
    fake_engines.fail = ("only-int4_head", "sleep")
    report = _bench(tmp_path)
    log = fake_engines.log
    assert log.index(("only-int4_head", "close")) < log.index(("only-w4_drafter", "start"))
    sets = {s["set"]: s for s in report["sets"]}
    assert "sleep: RuntimeError" in sets["only-int4_head"]["error"]
    assert "error" not in sets["only-w4_drafter"] and len(sets["only-w4_drafter"]["rounds"]) == 2
    assert [s["set"] for s in report["sets"]] == ["stock@v2", "only-int4_head", "only-w4_drafter"]


def test_a_reference_that_cannot_sleep_starts_no_other_engine_with_the_gpu_sleep_mode_faked(tmp_path, fake_engines):
    fake_engines.fail = ("stock@v2", "sleep")
    report = _bench(tmp_path)
    assert [x for x in fake_engines.log if x[1] == "start"] == [("stock@v2", "start")]
    assert len(report["sets"]) == 3 and all("error" in s for s in report["sets"])


def test_without_take_turns_both_engines_stay_awake(tmp_path, monkeypatch):
    events = []

    class Both(_FakeEngine):
        def __init__(self, fs, *a):
            self.name, self.error = fs.name, None
            self.e = run._Engine(fs, 4, {}, {"server_args": []}, Path(a[-1]) / "x.log", "")
            events.append((fs.name, "start"))

        def turn(self, op):
            raise AssertionError("no turns without --take-turns")

        def measure(self, lossless):
            events.append((self.name, "measure"))
            return run._annotate({"set": self.name, "results": [{"batch": 8, "decode_tok_s": 1.0}]}, self.e)

        def close(self):
            pass

    monkeypatch.setattr(run, "Resident", Both)
    _bench(tmp_path, take_turns=False)
    assert events[:4] == [("stock@v2", "start"), ("only-int4_head", "start"), ("stock@v2", "measure"),
                          ("only-int4_head", "measure")]


class _FakeLLM:
    """vLLM's LLM where its sleep mode cannot run (this machine has no GPU)."""

    def __init__(self, raises=None):
        self.calls, self.raises = [], raises

    def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method))

    def sleep(self, level):
        self.calls.append(("sleep", level))
        if self.raises:
            raise self.raises

    def wake_up(self):
        self.calls.append(("wake_up",))
        return not isinstance(self.raises, MemoryError)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_the_worker_drops_the_weights_and_draws_them_again_on_waking_with_the_llm_faked():
    llm = _FakeLLM()
    assert "s" in worker.turn(llm, "sleep") and "s" in worker.turn(llm, "wake")
    # level 2: nothing parked in host memory but integer parameters; the weights drawn again before the
    # first step, the prefix cache forgotten
    assert llm.calls == [("rpc", worker_extension.KEEP), ("sleep", 2), ("wake_up",),
                         ("rpc", worker_extension.REDRAW), ("reset_prefix_cache",)]
    failed = worker.turn(_FakeLLM(RuntimeError("sleep mode is not enabled")), "sleep")
    assert failed == {"error": "RuntimeError: sleep mode is not enabled"}
    assert "partly asleep" in worker.turn(_FakeLLM(MemoryError()), "wake")["error"]


def test_the_synthetic_rates_are_sent_again_after_every_wake_with_the_llm_faked(tmp_path, monkeypatch):
    """A level-2 sleep discards what vLLM allocated with the weights, the rejection sampler's synthetic rates
    among them: the worker sends the rates again before the first measurement after a wake, and only then."""
    import io

    llm = _FakeLLM()
    llm.get_tokenizer = lambda: None
    monkeypatch.setattr(worker, "start", lambda job: (llm, {"set": job["set"], "results": []}))
    monkeypatch.setattr(worker, "_batches", lambda llm, sp, tok, job, rates, result, verdicts:
                        llm.calls.append(("measure", tuple(rates))))
    monkeypatch.setattr(worker, "_metrics", lambda llm: ({}, []))
    commands = [{"n": 1}, {"n": 2}, {"n": 3, "op": "sleep"}, {"n": 4, "op": "wake"}, {"n": 5}, {"n": 6}]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps(c) + "\n" for c in commands)))
    job = {"set": "stock", "acceptance": [[0.9, 0.8]], "batches": [1], "max_tokens": 4, "prompts": []}
    assert worker.serve(job, tmp_path / "result.json") == 0
    rates = [c for c in llm.calls if c[0] in ("rpc", "measure")
             and c[1] not in (worker_extension.KEEP, worker_extension.REDRAW)]
    assert rates == [("measure", (0.9, 0.8)), ("measure", (0.9, 0.8)),
                     ("rpc", worker_extension.RATES), ("measure", (0.9, 0.8)), ("measure", (0.9, 0.8))]


@pytest.mark.parametrize("args,needle", [
    (["--take-turns", "--platform", "cuda"], "only with --keep-reference"),
    (["--keep-reference", "--take-turns", "--platform", "cpu", "--sets", "stock,only-int4_head"],
     "needs a CUDA or ROCm GPU"),
    (["--keep-reference", "--take-turns", "--platform", "cuda", "--sets", "stock,only-w4_drafter"],
     "load-format is not dummy"),
])
def test_take_turns_is_refused_where_it_cannot_run(args, needle):
    profile = "profiles/tiny-gpu.yaml" if needle == "load-format is not dummy" else PROFILE   # real weights
    res = CliRunner().invoke(cli, ["bench", profile, *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "fix:" in res.output


def test_take_turns_keeps_the_profiles_memory_budget_and_asks_vllm_for_sleep_mode(tmp_path):
    profile = load(PROFILE)   # gpu-memory-utilization 0.9: too much for two engines awake at once
    sets = plan.parse("stock@v2,only-int4_head", profile, "cuda")
    with pytest.raises(errors.UsageError, match="gpu-memory-utilization=0.47"):
        bench_cmd._check_keep_reference(profile, PROFILE, sets, "cuda", take_turns=False)
    bench_cmd._check_keep_reference(profile, PROFILE, sets, "cuda", take_turns=True)
    opts = run.Options(batches=[8], max_tokens=8, keep_reference=True, take_turns=True)
    e = run._engine(sets[0], profile, "cuda", opts, tmp_path)
    assert "--enable-sleep-mode" in e.job["server_args"]
    assert worker_extension.EXTENSION in e.job["server_args"]   # the weights are drawn again through it
    assert "--enable-sleep-mode" not in run._engine(sets[0], profile, "cuda", run.Options(batches=[8], max_tokens=8),
                                                    tmp_path).job["server_args"]
    json.dumps(e.job)


def test_the_weights_come_back_drawn_again_and_what_cannot_be_drawn_kept_with_the_level_two_sleep_faked():
    """The worker extension on real modules; the GPU sleep that drops their memory is faked by overwriting
    every parameter with garbage (NaN, random integers), which is what a level-2 wake hands back."""
    import torch
    from torch import nn

    class Runner:
        pass

    target = nn.Linear(8, 8)
    target.register_parameter("index", nn.Parameter(torch.arange(8, dtype=torch.int32), requires_grad=False))
    target.register_buffer("w4_qweight", torch.full((4,), 7, dtype=torch.uint8), persistent=False)
    draft = nn.Module()
    draft.fc = nn.Linear(8, 4)
    draft.head = target                                    # MTP shares the target's head
    draft.register_buffer("w4_scales", torch.linspace(0, 1, 4), persistent=False)
    runner = Runner()
    runner.get_model = lambda: target
    runner.get_draft_model = lambda: draft
    ext = worker_extension.BenchWorkerExtension()
    ext.model_runner = runner

    kept = ext.radiance_bench_keep_before_sleep()
    assert kept == 1   # the target's integer parameter, once though the draft shares it; buffers are vLLM's
    before = target.index.clone()
    with torch.no_grad():   # parameters only: vLLM's own wake puts the buffers back
        for t in [*target.parameters(), *draft.parameters()]:
            t.copy_(torch.full_like(t, float("nan")) if t.is_floating_point() else torch.randint_like(t, 0, 99))
    drawn = ext.radiance_bench_redraw_weights()
    assert drawn == 4   # target weight + bias, draft fc weight + bias; the shared head once
    for p in [target.weight, target.bias, draft.fc.weight, draft.fc.bias]:
        assert torch.isfinite(p).all() and p.abs().max() <= 1e-3
    assert torch.equal(target.index, before)


def test_the_extension_reaches_the_models_vllm_sleep_mode_keeps_buffers_of():
    """What the extension relies on in the installed vLLM: both runners answer ``get_draft_model``, and a
    level-2 sleep keeps that module's buffers and the target's (so the extension keeps integer parameters only)."""
    import inspect

    from vllm.v1.worker import gpu_model_runner, gpu_worker
    from vllm.v1.worker.gpu import model_runner as v2

    assert callable(gpu_model_runner.GPUModelRunner.get_draft_model) and callable(v2.GPUModelRunner.get_draft_model)
    sleep, wake = inspect.getsource(gpu_worker.Worker.sleep), inspect.getsource(gpu_worker.Worker.wake_up)
    assert "model.named_buffers()" in sleep and "draft.named_buffers()" in sleep
    assert "_sleep_saved_draft_buffers" in wake and "_sleep_saved_buffers" in wake
