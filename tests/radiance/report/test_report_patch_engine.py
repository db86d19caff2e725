"""radiance/report/patch_engine.py and stats.py: the engine core moves the worker's payload into the step's
spec-decoding stats, and vLLM's msgpack channel to the API server carries it (real vLLM types, no engine)."""
from __future__ import annotations

import pytest

vllm = pytest.importorskip("vllm")

from vllm.v1.engine import EngineCoreOutputs  # noqa: E402
from vllm.v1.metrics.stats import SchedulerStats  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.spec_decode.metrics import SpecDecodingStats  # noqa: E402

from radiance.report import patch_engine  # noqa: E402
from radiance.report.stats import RadianceSpecDecodingStats  # noqa: E402

PAYLOAD = {"counters": [["radiance:draft_steps_total", {"depth": 1}, 2, "steps"]]}


@pytest.fixture
def installed():
    patch = patch_engine.EngineReportPatch()
    assert patch.install(vllm.__version__).status == "applied"
    yield patch
    patch.revert()


def _runner_output(payload=None) -> ModelRunnerOutput:
    out = ModelRunnerOutput(req_ids=[], req_id_to_index={})
    if payload is not None:
        out.radiance = payload
    return out


class FakeScheduler:
    """A stand-in for vLLM's Scheduler (a real one needs a whole engine config): its ``update_from_output``
    returns what the stock one does, EngineCoreOutputs per client with this step's stats (``stats``)."""

    def __init__(self, num_spec_tokens: int) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.stats: SchedulerStats | None = None

    def update_from_output(self, scheduler_output, model_runner_output):
        return {0: EngineCoreOutputs(scheduler_stats=self.stats)}


@pytest.fixture
def scheduler_cls():
    """FakeScheduler with the patch's hooks on it, as ``install`` puts them on vLLM's."""
    patch = patch_engine.EngineReportPatch()
    patch.hook(patch_engine.SchedulerHooks, owner=FakeScheduler)
    yield FakeScheduler
    patch.revert()


def _step(scheduler: FakeScheduler, stats: SchedulerStats | None, payload=None):
    scheduler.stats = stats
    return scheduler.update_from_output(None, _runner_output(payload))


def test_the_stats_type_is_vllms_with_one_defaulted_field():
    stats = RadianceSpecDecodingStats.new(3)
    assert isinstance(stats, SpecDecodingStats) and stats.radiance == {} and stats.num_draft_tokens_per_pos == [0] * 3


def test_install_swaps_the_stats_type_and_its_annotation_and_revert_restores_them():
    from vllm.v1.core.sched import scheduler as sched

    before = (sched.SpecDecodingStats, SchedulerStats.__annotations__["spec_decoding_stats"],
              sched.Scheduler.update_from_output)
    patch = patch_engine.EngineReportPatch()
    assert patch.install(vllm.__version__).status == "applied"
    try:
        assert sched.SpecDecodingStats is RadianceSpecDecodingStats
        assert SchedulerStats.__annotations__["spec_decoding_stats"] == (RadianceSpecDecodingStats | None)
        assert sched.Scheduler.update_from_output is not before[2]
        assert sched.Scheduler._orig_update_from_output is before[2]
    finally:
        patch.revert()
    assert (sched.SpecDecodingStats, SchedulerStats.__annotations__["spec_decoding_stats"],
            sched.Scheduler.update_from_output) == before


def test_the_payload_goes_into_the_steps_spec_decoding_stats(scheduler_cls):
    scheduler = scheduler_cls(2)
    spec = RadianceSpecDecodingStats.new(2)
    outputs = _step(scheduler, SchedulerStats(spec_decoding_stats=spec), PAYLOAD)
    assert outputs[0].scheduler_stats.spec_decoding_stats is spec and spec.radiance == PAYLOAD
    assert scheduler._radiance_pending is None


def test_a_step_without_drafts_gets_empty_stats_to_carry_it(scheduler_cls):
    scheduler = scheduler_cls(3)
    spec = _step(scheduler, SchedulerStats(), PAYLOAD)[0].scheduler_stats.spec_decoding_stats
    assert isinstance(spec, RadianceSpecDecodingStats) and spec.radiance == PAYLOAD and spec.num_spec_tokens == 3


def test_a_step_whose_stats_are_not_sent_keeps_the_payload_for_the_next(scheduler_cls):
    scheduler = scheduler_cls(1)
    assert _step(scheduler, None, PAYLOAD)[0].scheduler_stats is None
    assert _step(scheduler, None, PAYLOAD)[0].scheduler_stats is None
    assert scheduler._radiance_pending["counters"] == PAYLOAD["counters"] * 2   # merged, not lost
    spec = _step(scheduler, SchedulerStats())[0].scheduler_stats.spec_decoding_stats
    assert spec.radiance["counters"] == PAYLOAD["counters"] * 2 and scheduler._radiance_pending is None


def test_stock_stats_are_left_alone(scheduler_cls):
    scheduler = scheduler_cls(1)
    stock = SpecDecodingStats.new(1)   # built before the patch swapped the type: carries no field
    _step(scheduler, SchedulerStats(spec_decoding_stats=stock), PAYLOAD)
    assert not hasattr(stock, "radiance") and scheduler._radiance_pending == PAYLOAD


def test_vllms_msgpack_channel_carries_the_payload_to_the_api_server(installed):
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    spec = RadianceSpecDecodingStats.new(2)
    spec.radiance = PAYLOAD
    wire = MsgpackEncoder().encode(EngineCoreOutputs(scheduler_stats=SchedulerStats(spec_decoding_stats=spec)))
    decoded = MsgpackDecoder(EngineCoreOutputs).decode(wire).scheduler_stats.spec_decoding_stats
    assert isinstance(decoded, RadianceSpecDecodingStats) and decoded.radiance == PAYLOAD
