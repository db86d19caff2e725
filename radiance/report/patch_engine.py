"""The engine-core end of the report channel (vLLM 0.32 ``vllm.v1.core.sched.scheduler.Scheduler``, and
the stats type its channel to the API server decodes).

Hooks:
``scheduler.SpecDecodingStats`` (replaced by ``RadianceSpecDecodingStats``)
    the scheduler builds each step's spec-decoding stats from this name (``SpecDecodingStats.new``),
    so they carry the payload field.
``SchedulerStats``'s ``spec_decoding_stats`` annotation (replaced by the subclass)
    vLLM's msgpack decoder in the API server types the stats by this annotation; it is read when the
    engine client builds its decoder, after the plugin loads in that process.
``Scheduler.update_from_output`` (``SchedulerHooks``)
    the worker's payload (``ModelRunnerOutput.radiance``) goes into the step's stats; a step whose
    stats are not sent (no stats this step) keeps it for the next; a step with payload but no drafts
    gets empty spec-decoding stats to carry it.
"""
from __future__ import annotations

from ..patching import Hooks, Patch, resolve
from . import channel

_SCHED = "vllm.v1.core.sched.scheduler"
_STATS = "vllm.v1.metrics.stats.SchedulerStats"


class SchedulerHooks(Hooks):
    """``Scheduler`` (and ``AsyncScheduler``, its subclass)."""

    target = f"{_SCHED}.Scheduler"
    via = "_radiance_engine_report"

    def update_from_output(self, scheduler_output, model_runner_output):
        payload = getattr(model_runner_output, channel.FIELD, None)
        if payload:
            self._radiance_pending = channel.merge(getattr(self, "_radiance_pending", None), payload)
        outputs = self._orig_update_from_output(scheduler_output, model_runner_output)
        self._radiance_engine_report.carry_pending(self, outputs)
        return outputs


class EngineReportPatch(Patch):
    name = "report.engine"
    feature = ""
    hook_points = (f"{_SCHED}.Scheduler.update_from_output", f"{_SCHED}.SpecDecodingStats", _STATS)

    def apply(self) -> None:
        from .stats import RadianceSpecDecodingStats

        sched_mod, _, _ = resolve(f"{_SCHED}.SpecDecodingStats")
        self.replace(sched_mod, "SpecDecodingStats", RadianceSpecDecodingStats)
        _, _, stats_cls = resolve(_STATS)
        annotations = stats_cls.__annotations__
        self._annotation = (annotations, annotations["spec_decoding_stats"])
        annotations["spec_decoding_stats"] = RadianceSpecDecodingStats | None
        self.hook(SchedulerHooks)

    def revert(self) -> None:
        annotation = getattr(self, "_annotation", None)
        if annotation is not None:
            annotation[0]["spec_decoding_stats"] = annotation[1]
            self._annotation = None
        super().revert()

    @staticmethod
    def carry_pending(scheduler, outputs) -> None:
        """The scheduler's pending payload into the first stats this step sends (kept if none is sent)."""
        from .stats import RadianceSpecDecodingStats

        pending = getattr(scheduler, "_radiance_pending", None)
        if not pending:
            return
        for eco in outputs.values():
            stats = eco.scheduler_stats
            if stats is None:
                continue
            spec = stats.spec_decoding_stats
            if spec is None:
                spec = RadianceSpecDecodingStats.new(getattr(scheduler, "num_spec_tokens", 0) or 0)
                stats.spec_decoding_stats = spec
            if isinstance(spec, RadianceSpecDecodingStats):
                spec.radiance = pending
                scheduler._radiance_pending = None
            break


PATCHES = [EngineReportPatch()]
