"""The worker end of the report channel (vLLM 0.32 ``vllm.v1.worker.gpu_worker.Worker``; the CPU worker
inherits it).

Hooks:
``Worker.load_model`` (``WorkerHooks``)
    after the stock load (target, drafter, DFlash taps), each applied patch says whether it will run
    stock for what was loaded (``Patch.after_load``: declined, with why), then every TP rank's patch
    report is gathered over
    the TP group's CPU communicator. A patch whose ranks disagree is reconciled on every rank alike
    (the gathered lists are the same everywhere): ``Patch.on_ranks_disagree`` -- fp8-stream takes its
    contract off, since ranks that stream and ranks that do not would all-reduce different things --
    and its outcome becomes ``mixed``. TP rank 0 keeps every rank's rows for the channel.
``Worker.execute_model`` / ``Worker.sample_tokens`` (``WorkerHooks``)
    on TP rank 0 (the rank whose output vLLM's executor returns), the step's payload
    (``channel.take_payload``) is attached to the ``ModelRunnerOutput`` as ``radiance``; an async output
    (V1's or Model Runner V2's, whose attribute names differ: ``_WRAPPED``) gets it on the plain output it
    wraps. A step with no output keeps it for the next.
Fail closed: a failure here is logged once and the step is untouched; a failed gather leaves each
rank's report as it was (and says so).
"""
from __future__ import annotations

import logging

from ..patching import Hooks, Outcome, Patch, report
from . import channel

logger = logging.getLogger("radiance")

_WORKER = "vllm.v1.worker.gpu_worker.Worker"


def _tp():
    from vllm.distributed import get_tp_group

    return get_tp_group()


def _is_output_rank() -> bool:
    try:
        from vllm.distributed import get_pp_group

        return _tp().rank_in_group == 0 and get_pp_group().is_last_rank
    except Exception:
        return True


def reconcile(gathered: list[list[dict]], patches_by_name: dict, model) -> list[list[dict]]:
    """Every rank the same: the rows after disagreements are settled (``mixed`` where ranks differ)."""
    names = []
    for rows in gathered:
        for row in rows:
            if row["patch"] not in names:
                names.append(row["patch"])
    out = [list(rows) for rows in gathered]
    for name in names:
        per_rank = [next((r for r in rows if r["patch"] == name), None) for rows in gathered]
        statuses = {r["status"] if r else "absent" for r in per_rank}
        if len(statuses) == 1:
            continue
        summary = "; ".join(f"rank {i}: {r['status'] if r else 'absent'}"
                            + (f" ({r['reason']})" if r and r.get("reason") else "")
                            for i, r in enumerate(per_rank))
        patch = patches_by_name.get(name)
        action = ""
        if patch is not None:
            try:
                action = patch.on_ranks_disagree(model) or ""
            except Exception as exc:  # settling must not fail the load
                action = f"settling raised {type(exc).__name__}: {exc}"
        feature = next((r["feature"] for r in per_rank if r), "")
        reason = f"the TP ranks disagree ({summary})" + (f"; {action}" if action else "")
        status = "declined" if action else "mixed"
        logger.warning("radiance: %s %s: %s", feature or name, status, reason)
        report().record(Outcome(name, feature, status, reason))
        for rows in out:
            for i, row in enumerate(rows):
                if row["patch"] == name:
                    rows[i] = {**row, "status": status, "reason": reason}
    return out


def settle_after_load(runner) -> None:
    """Each applied patch's ``after_load``: one that runs stock for what this worker loaded (no drafter,
    another architecture) is reported declined, with its reason, before the gather (so on every rank)."""
    from ..plugin import registry

    reg = registry()
    rows = {r["patch"]: r for r in report().rows()}
    for p in (reg.patches if reg else []):
        if not p.applied or p.latched_off or rows.get(p.name, {}).get("status") != "applied":
            continue
        try:
            why = p.after_load(runner)
        except Exception as exc:  # a report must never fail the load
            why = None
            logger.warning("radiance: %s: after-load check raised %s: %s", p.feature or p.name,
                           type(exc).__name__, exc)
        if why:
            logger.warning("radiance: declined %s (%s): %s", p.feature or p.name, p.name, why)
            report().record(Outcome(p.name, p.feature, "declined", why))


class WorkerHooks(Hooks):
    """``Worker`` (the GPU worker; the CPU worker is its subclass)."""

    target = _WORKER
    via = "_radiance_worker_report"

    def load_model(self, *args, **kwargs):
        result = self._orig_load_model(*args, **kwargs)
        self._radiance_worker_report.report_the_load(self)
        return result

    def execute_model(self, *args, **kwargs):
        return self._radiance_worker_report.with_payload(self._orig_execute_model(*args, **kwargs))

    def sample_tokens(self, *args, **kwargs):
        return self._radiance_worker_report.with_payload(self._orig_sample_tokens(*args, **kwargs))


class WorkerReportPatch(Patch):
    name = "report.worker"
    feature = ""
    hook_points = (f"{_WORKER}.load_model", f"{_WORKER}.execute_model", f"{_WORKER}.sample_tokens",
                   "vllm.v1.outputs.ModelRunnerOutput", "vllm.distributed.get_tp_group")

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict | None = None
        self._warned = False

    def apply(self) -> None:
        self.hook(WorkerHooks)

    # -- after the load: every rank's report --------------------------------------------
    def report_the_load(self, worker) -> None:
        settle_after_load(getattr(worker, "model_runner", None))
        try:
            self.gather(getattr(getattr(worker, "model_runner", None), "model", None))
        except Exception as exc:
            logger.warning("radiance: patch reports of the TP ranks not gathered (%s: %s); each rank "
                           "reports for itself", type(exc).__name__, exc)
            channel.set_ranks({str(_tp().rank_in_group): report().rows()})

    @staticmethod
    def gather(model) -> None:
        import torch.distributed as dist

        from ..plugin import registry

        tp = _tp()
        rows = report().rows()
        if tp.world_size > 1:
            gathered: list = [None] * tp.world_size
            dist.all_gather_object(gathered, rows, group=tp.cpu_group)
        else:
            gathered = [rows]
        reg = registry()
        by_name = {p.name: p for p in (reg.patches if reg else [])}
        settled = reconcile(gathered, by_name, model)
        if tp.rank_in_group == 0:
            channel.set_ranks({str(r): rows for r, rows in enumerate(settled)})

    # -- every step: the payload on rank 0's output --------------------------------------
    def with_payload(self, out):
        """``out`` (a step's output), with the pending payload attached on the output rank; a failure is
        logged once and leaves the step untouched."""
        if out is None or not _is_output_rank():
            return out
        try:
            self._attach(out)
        except Exception as exc:
            if not self._warned:
                self._warned = True
                logger.warning("radiance: report channel: payload not attached (%s: %s)",
                               type(exc).__name__, exc)
        return out

    def _attach(self, out) -> None:
        from vllm.v1 import outputs

        payload = channel.take_payload()
        if payload is not None:
            self._pending = channel.merge(self._pending, payload)
        if self._pending is None:
            return
        target = _plain_output(out, outputs.ModelRunnerOutput)
        # vLLM returns one shared empty output for a step with nothing to run: a payload set on it would ride
        # every later empty step too, so it waits for a step of its own
        if target is not None and target is not getattr(outputs, "EMPTY_MODEL_RUNNER_OUTPUT", None):
            setattr(target, channel.FIELD, self._pending)
            self._pending = None


# Where an asynchronous output keeps the plain one it wraps: V1's runner (``AsyncGPUModelRunnerOutput``) and
# Model Runner V2 (``vllm.v1.worker.gpu.async_utils.AsyncOutput``, every step under async scheduling).
_WRAPPED = ("_model_runner_output", "model_runner_output")


def _plain_output(out, plain_type):
    """The ``ModelRunnerOutput`` the scheduler will read for this step's output, or None."""
    if isinstance(out, plain_type):
        return out
    for attr in _WRAPPED:
        inner = getattr(out, attr, None)
        if isinstance(inner, plain_type):
            return inner
    return None


PATCHES = [WorkerReportPatch()]
