"""`radiance bench --keep-reference --take-turns`: the engine not measured sleeps, so each engine runs with the
profile's whole memory budget. vLLM's sleep mode exists on CUDA and ROCm only, so here the two engines (and, for
the worker's side, the LLM) are fakes: what is checked is the order of turns and what the CLI refuses."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import errors
from launcher.bench import plan, run, worker
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


def _bench(tmp_path, take_turns=True):
    profile = load(PROFILE)
    sets = plan.parse("stock@v2,only-int4_head,only-w4_drafter", profile, "cuda")
    opts = run.Options(batches=[8], max_tokens=8, rounds=2, keep_reference=True, take_turns=take_turns)
    return run.bench(profile, PROFILE, "cuda", sets, opts, "abc", tmp_path / "logs")


def test_take_turns_measures_each_engine_alone_with_the_gpu_sleep_mode_faked(tmp_path, fake_engines):
    report = _bench(tmp_path)
    log = fake_engines.log
    assert log[:3] == [("stock@v2", "start"), ("stock@v2", "sleep"), ("only-int4_head", "start")]
    pair = [("only-int4_head", "sleep"), ("stock@v2", "wake"), ("stock@v2", "measure"), ("stock@v2", "sleep"),
            ("only-int4_head", "wake"), ("only-int4_head", "measure")]
    assert log[3:15] == pair + pair
    assert log[15:17] == [("only-int4_head", "close"), ("only-w4_drafter", "start")]
    assert log[-1] == ("stock@v2", "close")
    assert sum(1 for x in log if x[1] == "measure") == 8
    assert report["options"]["take_turns"] is True and report["options"]["rounds_done"] == 2
    assert [s["set"] for s in report["sets"]] == ["stock@v2", "only-int4_head", "only-w4_drafter"]


def test_a_turn_that_fails_is_the_error_of_what_it_left_unmeasured_with_the_gpu_sleep_mode_faked(tmp_path,
                                                                                                fake_engines):
    fake_engines.fail = ("only-int4_head", "wake")
    report = _bench(tmp_path)
    sets = {s["set"]: s for s in report["sets"]}
    # the reference was measured; the set that could not wake is reported with why, and the next set still runs
    assert "error" not in sets["stock@v2"]
    assert "wake: RuntimeError: no sleep mode" in sets["only-int4_head"]["error"]
    assert "error" not in sets["only-w4_drafter"]


def test_a_reference_that_cannot_sleep_starts_no_other_engine_with_the_gpu_sleep_mode_faked(tmp_path, fake_engines):
    fake_engines.fail = ("stock@v2", "sleep")
    report = _bench(tmp_path)
    assert [x for x in fake_engines.log if x[1] == "start"] == [("stock@v2", "start")]
    assert all("error" in s for s in report["sets"])


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

    def sleep(self, level):
        self.calls.append(("sleep", level))
        if self.raises:
            raise self.raises

    def wake_up(self):
        self.calls.append(("wake_up",))
        return not isinstance(self.raises, MemoryError)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def test_the_worker_sleeps_at_level_one_and_forgets_its_prefix_cache_on_waking_with_the_llm_faked():
    llm = _FakeLLM()
    assert "s" in worker.turn(llm, "sleep") and "s" in worker.turn(llm, "wake")
    assert llm.calls == [("sleep", 1), ("wake_up",), ("reset_prefix_cache",)]
    failed = worker.turn(_FakeLLM(RuntimeError("sleep mode is not enabled")), "sleep")
    assert failed == {"error": "RuntimeError: sleep mode is not enabled"}
    assert "partly asleep" in worker.turn(_FakeLLM(MemoryError()), "wake")["error"]


@pytest.mark.parametrize("args,needle", [
    (["--take-turns", "--platform", "cuda"], "only with --keep-reference"),
    (["--keep-reference", "--take-turns", "--platform", "cpu", "--sets", "stock,only-int4_head"],
     "needs a CUDA or ROCm GPU"),
])
def test_take_turns_is_refused_where_it_cannot_run(args, needle):
    res = CliRunner().invoke(cli, ["bench", PROFILE, *args])
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
    assert "--enable-sleep-mode" not in run._engine(sets[0], profile, "cuda", run.Options(batches=[8], max_tokens=8),
                                                    tmp_path).job["server_args"]
    json.dumps(e.job)
