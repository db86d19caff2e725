"""radiance/report/patch_worker.py: after the load every rank's report is settled and gathered; each step,
rank 0's output carries the payload. The Worker class and ModelRunnerOutput are vLLM's; the worker
instance, its TP group and the stock methods are stand-ins (a real Worker needs a device and an engine)."""
from __future__ import annotations

import types

import pytest

vllm = pytest.importorskip("vllm")

from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

from radiance import patching, plugin  # noqa: E402
from radiance.patching import Patch, Registry  # noqa: E402
from radiance.report import patch_worker  # noqa: E402

ROW = {"patch": "test.worker.probe", "feature": "dynamic_draft", "status": "applied", "reason": ""}


class ProbePatch(Patch):
    name = "test.worker.probe"
    feature = "dynamic_draft"

    def __init__(self, after_load=None, settle=None):
        super().__init__()
        self.applied = True
        self._after_load, self._settle = after_load, settle

    def after_load(self, runner):
        return self._after_load

    def on_ranks_disagree(self, model):
        return self._settle


@pytest.fixture
def clean_report(monkeypatch):
    monkeypatch.setattr(patching, "_REPORT", patching.Report())
    return patching.report()


@pytest.fixture
def one_rank(monkeypatch):
    group = types.SimpleNamespace(world_size=1, rank_in_group=0)
    monkeypatch.setattr(patch_worker, "_tp", lambda: group)
    return group


@pytest.fixture
def hooked():
    """``hooked(patch, load=..., step=...)``: a stand-in worker whose stock ``load_model`` is ``load`` and whose
    stock ``execute_model``/``sample_tokens`` are ``step``, with the patch's hooks on its class."""
    patches = []

    def make(patch, load=None, step=None):
        class FakeWorker:
            model_runner = types.SimpleNamespace(model=None)

            def load_model(self):
                return load(self)

            def execute_model(self):
                return step(self)

            def sample_tokens(self):
                return step(self)

        patch.hook(patch_worker.WorkerHooks, owner=FakeWorker)
        patches.append(patch)
        return FakeWorker()

    yield make
    for patch in patches:
        patch.revert()


def test_install_wraps_the_workers_three_methods_and_revert_restores_them():
    from vllm.v1.worker.gpu_worker import Worker

    before = (Worker.load_model, Worker.execute_model, Worker.sample_tokens)
    patch = patch_worker.WorkerReportPatch()
    assert patch.install(vllm.__version__).status == "applied"
    try:
        assert Worker._orig_load_model is before[0] and Worker.execute_model is not before[1]
    finally:
        patch.revert()
    assert (Worker.load_model, Worker.execute_model, Worker.sample_tokens) == before


def test_ranks_that_agree_are_left_as_they_are(clean_report):
    gathered = [[ROW], [ROW]]
    assert patch_worker.reconcile(gathered, {}, None) == gathered and clean_report.rows() == []


def test_ranks_that_disagree_merge_as_mixed(clean_report):
    declined = {**ROW, "status": "declined", "reason": "no drafter"}
    out = patch_worker.reconcile([[ROW], [declined]], {ROW["patch"]: ProbePatch()}, None)
    reason = "the TP ranks disagree (rank 0: applied; rank 1: declined (no drafter))"
    assert out == [[{**ROW, "status": "mixed", "reason": reason}], [{**declined, "status": "mixed", "reason": reason}]]
    assert clean_report.outcomes[ROW["patch"]].status == "mixed"


def test_a_patch_that_settles_the_split_is_declined_on_every_rank(clean_report):
    out = patch_worker.reconcile([[ROW], []], {ROW["patch"]: ProbePatch(settle="stock contract on every rank")},
                                 None)
    assert out[0][0]["status"] == "declined" and out[1] == []
    assert out[0][0]["reason"] == "the TP ranks disagree (rank 0: applied; rank 1: absent); stock contract on every rank"


def test_after_load_declines_a_patch_that_runs_stock_for_what_was_loaded(clean_report, monkeypatch):
    probe, kept = ProbePatch(after_load="the drafter is ngram, not MTP"), ProbePatch()
    kept.name = "test.worker.kept"
    for p in (probe, kept):
        clean_report.record(patching.Outcome(p.name, p.feature, "applied"))
    monkeypatch.setattr(plugin, "_registry", Registry([probe, kept]))
    patch_worker.settle_after_load(runner=None)
    assert clean_report.outcomes[probe.name].status == "declined"
    assert clean_report.outcomes[probe.name].reason == "the drafter is ngram, not MTP"
    assert clean_report.outcomes[kept.name].status == "applied"


def test_the_load_gathers_the_report_into_the_channel(clean_report, one_rank, fresh_channel, monkeypatch,
                                                      hooked):
    monkeypatch.setattr(plugin, "_registry", Registry([]))
    clean_report.record(patching.Outcome(ROW["patch"], ROW["feature"], "applied"))
    worker = hooked(patch_worker.WorkerReportPatch(), load=lambda worker: "loaded")
    assert worker.load_model() == "loaded"
    assert fresh_channel.take_payload()["ranks"] == {"0": [ROW]}


def test_rank_0s_output_carries_the_payload_once(fresh_channel, monkeypatch, hooked):
    monkeypatch.setattr(patch_worker, "_is_output_rank", lambda: True)
    fresh_channel.set_ranks({0: [ROW]})
    worker = hooked(patch_worker.WorkerReportPatch(),
                    step=lambda worker: ModelRunnerOutput(req_ids=[], req_id_to_index={}))
    first, second = worker.execute_model(), worker.sample_tokens()
    assert first.radiance == {"counters": [], "ranks": {"0": [ROW]}} and not hasattr(second, "radiance")


def test_a_step_without_output_keeps_the_payload_for_the_next(fresh_channel, monkeypatch, hooked):
    monkeypatch.setattr(patch_worker, "_is_output_rank", lambda: True)
    fresh_channel.add_counter_source(lambda: [("c", {}, 1, "doc")])
    outputs = iter([types.SimpleNamespace(), ModelRunnerOutput(req_ids=[], req_id_to_index={})])
    worker = hooked(patch_worker.WorkerReportPatch(), step=lambda worker: next(outputs))
    assert not hasattr(worker.execute_model(), "radiance")   # not a ModelRunnerOutput: nothing attached
    assert worker.execute_model().radiance == {"counters": [["c", {}, 1, "doc"], ["c", {}, 1, "doc"]]}


@pytest.mark.parametrize("attr", ["_model_runner_output", "model_runner_output"], ids=["v1", "v2"])
def test_an_async_output_stand_in_gets_it_on_the_plain_output_it_wraps(attr, fresh_channel, monkeypatch, hooked):
    """No GPU here to build either runner's async output (CUDA streams and events): stand-ins with their
    attribute, which the next test but one holds to vLLM's own classes. Every V2 step that runs the model returns
    one, so without V2's name the ranks' rows waited for a step with nothing scheduled to leave a GPU engine."""
    monkeypatch.setattr(patch_worker, "_is_output_rank", lambda: True)
    fresh_channel.set_ranks({0: [ROW]})
    plain = ModelRunnerOutput(req_ids=[], req_id_to_index={})
    wrapper = types.SimpleNamespace(**{attr: plain})
    hooked(patch_worker.WorkerReportPatch(), step=lambda worker: wrapper).sample_tokens()
    assert plain.radiance["ranks"] == {"0": [ROW]} and not hasattr(wrapper, "radiance")


def test_vllms_shared_empty_output_is_never_written_the_payload_waits(fresh_channel, monkeypatch, hooked):
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

    monkeypatch.setattr(patch_worker, "_is_output_rank", lambda: True)
    fresh_channel.set_ranks({0: [ROW]})
    outputs = iter([EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput(req_ids=[], req_id_to_index={})])
    worker = hooked(patch_worker.WorkerReportPatch(), step=lambda worker: next(outputs))
    assert not hasattr(worker.execute_model(), "radiance")
    assert worker.execute_model().radiance["ranks"] == {"0": [ROW]}


def test_the_wrapped_outputs_attributes_are_vllms_own():
    import inspect

    from vllm.v1.worker.gpu.async_utils import AsyncOutput
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    v2, v1 = inspect.getsource(AsyncOutput), inspect.getsource(AsyncGPUModelRunnerOutput)
    assert "return self.model_runner_output" in v2 and "model_runner_output" in patch_worker._WRAPPED
    assert "self._model_runner_output = model_runner_output" in v1 and "_model_runner_output" in patch_worker._WRAPPED


def test_other_ranks_attach_nothing(fresh_channel, monkeypatch, hooked):
    monkeypatch.setattr(patch_worker, "_is_output_rank", lambda: False)
    fresh_channel.set_ranks({0: [ROW]})
    out = hooked(patch_worker.WorkerReportPatch(),
                 step=lambda worker: ModelRunnerOutput(req_ids=[], req_id_to_index={})).execute_model()
    assert not hasattr(out, "radiance") and fresh_channel.take_payload() is not None
