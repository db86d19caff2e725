"""The fp8-stream patch: plan and install the contract on every Qwen3-Next model vLLM loads.

Hooks (vLLM 0.32.0; each a ``Hooks`` class below, whose methods are the replacement code and reach
the patch as ``self._radiance_fp8_stream_patch``):
  * ``BaseModelLoader.load_model`` (``LoaderHooks``) -- after the stock load (weights processed),
    find the Qwen3NextModel core, plan it (plan.py: every guard of the seed) and install the plan
    (contract.py), or decline with one log line; the model returned is stock on any error.
  * ``EagleModelMixin._set_aux_hidden_state_layers`` (``TapHooks``) and, where vLLM's Qwen3.5
    module loads, ``Qwen3_5ForCausalLMBase.set_aux_hidden_state_layers`` (``Qwen35TapHooks``: it
    writes the core's taps itself, past the mixin) -- the model runner sets DFlash / EAGLE-3
    hidden-state taps *after* load_model; on an installed model the plan is made again around them
    (plan.py: the tapped layers' down sites keep the stock contract), so a DFlash drafter and
    fp8-stream run together; if the new plan declines, the contract comes off (one warning).
Checked for presence only (``relied_on``): ``Qwen3NextDecoderLayer.forward`` (the body
contract.py mirrors; each layer is checked to run it, so Qwen3.5's subclass qualifies and a
layer with its own forward does not), the aux-tap attribute, ``Qwen3NextRMSNorm`` being
``GemmaRMSNorm`` (the norm add_rms_quant reproduces; each layer's norms are checked too),
``tensor_model_parallel_all_reduce`` and ``RowParallelLinear.forward`` (which honours
``reduce_results``).

A worker whose target has no Qwen3-Next core reports the feature declined after the load
(``after_load``). At TP=2 with RADIANCE_FP8_STREAM_FUSED_AR every rank runs the fused epilogue's
self-test right after the plan (fused_allreduce.prove): it is used only where it passed on every rank.
At run time a fault in an epilogue is agreed by the ranks over the contract's own all-reduce and the
stream goes off on every rank in the same forward (contract.RunState; ``_on_agreed`` latches the patch
and, on TP rank 0, reports every rank).

Knobs: RADIANCE_FP8_STREAM, RADIANCE_GDN_NORM_QUANT (the fused GDN epilogue, gdn.py; read
at install) (radiance/envs.py). The traced graph changes where the contract
is installed, so vLLM's compile cache must be keyed on the knob (see the report).
"""
from __future__ import annotations

import logging

import torch

from .. import envs
from ..patching import Hooks, Outcome, Patch, report, resolve
from . import contract, gdn
from .plan import find_core, plan_stream, taps_of

logger = logging.getLogger("radiance")

_QWEN3_NEXT = "vllm.model_executor.models.qwen3_next"
_LOADER = "vllm.model_executor.model_loader.base_loader.BaseModelLoader"
_MIXIN = "vllm.model_executor.models.interfaces.EagleModelMixin"
VIA = "_radiance_fp8_stream_patch"  # the patch itself, on each hooked vLLM class (Hooks.via)


def _parallel_sizes() -> tuple[int, int]:
    from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_world_size(), get_pp_group().world_size


def fused_allreduce_wanted(tp: int) -> bool:
    """The two-rank fused epilogue: TP=2 on a CUDA / ROCm platform, RADIANCE_FP8_STREAM_FUSED_AR on."""
    if tp != 2 or not envs.get("RADIANCE_FP8_STREAM_FUSED_AR"):
        return False
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cuda_alike())
    except Exception:
        return False


PATCH_NAME = "fp8_stream.decoder_contract"


# Whether this process planned a Qwen3-Next core (installed or declined, either is recorded): a worker
# whose target has none reports the feature declined after the load (``after_load``).
_PLANNED: list[bool] = [False]


def _record(status: str, reason: str) -> None:
    report().record(Outcome(PATCH_NAME, "fp8_stream", status, reason))


def install_on(model, sizes=None) -> str:
    """Plan and install on ``model``; returns the one-line outcome that was logged (and recorded: what
    the plan did is the feature's outcome on this rank, not merely that the hooks are in)."""
    core = find_core(model)
    if core is None:
        return "not a Qwen3-Next model"  # the drafter, other architectures: nothing to do
    return _plan_and_install(core, sizes, declined="declined", installed="installed")


def replan_for_taps(core, sizes=None) -> str | None:
    """The taps of an installed core changed: plan again around them (None: nothing to do)."""
    done = contract.installed(core)
    if done is None or done.plan.taps == taps_of(core):
        return None
    contract.uninstall(core)
    return _plan_and_install(core, sizes, declined="taken off",
                             installed="installed again around the auxiliary hidden-state taps")


def _carrier_site(done):
    """(norm weight, eps, group size, fp8 dtype) of the first streamed site: what the self-test runs."""
    layer, site = done.run.carrier
    flags = getattr(layer, contract.STATE_ATTR)
    norm = layer.input_layernorm if site == "in" else layer.post_attention_layernorm
    if site == "in":
        return norm.weight, norm.variance_epsilon, flags.in_group, flags.in_dtype
    return norm.weight, norm.variance_epsilon, flags.mid_group, flags.mid_dtype


def _prove_fused(done) -> None:
    """Every rank of a TP=2 group, whatever its plan did: the fused epilogue's load-time self-test
    (fused_allreduce.prove); it is used only where it passed on every rank, and only on GPUs."""
    from . import fused_allreduce

    try:
        site = _carrier_site(done) if done is not None and done.run.carrier is not None else None
    except Exception as exc:  # noqa: BLE001 - this rank only votes, so its peers' collectives still match
        logger.warning("radiance: fp8-stream: the fused epilogue's self-test could not read its site (%s: %s)",
                       type(exc).__name__, exc)
        site = None
    if site is None:
        fused_allreduce.prove(None, 0.0, 0, torch.float8_e4m3fn, torch.bfloat16, torch.device("cpu"))
        if done is not None:
            contract.set_fused(done, False)
        return
    weight, eps, group, fp8_dtype = site
    ok, why = fused_allreduce.prove(weight, eps, group, fp8_dtype, weight.dtype, weight.device)
    if ok:
        on_gpu = fused_allreduce_wanted(2)
        logger.info("radiance: fp8-stream: the fused two-rank all-reduce epilogue proved itself on these ranks "
                    "(bit for bit against %s at M=%s)%s", "NCCL" if weight.is_cuda else "gloo",
                    ", ".join(map(str, fused_allreduce.PROVE_ROWS)),
                    "" if on_gpu else "; no two-rank kernel on this platform: the separate path runs")
        contract.set_fused(done, on_gpu)
        return
    note = f"the fused two-rank all-reduce epilogue is off on every rank ({why})"
    logger.warning("radiance: fp8-stream: %s; all-reduce then add_rms_quant", note)
    contract.set_fused(done, False, note)


def _on_agreed(faulted: list[int], forward: int, mine: str | None) -> None:
    """Every rank, the same forward: the carrier's all-reduce said which ranks faulted."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    rank, tp = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    ranks = ", ".join(map(str, faulted))
    together = "turned off on every rank together"
    if rank in faulted and mine:
        reason = f"fault on TP rank {rank} at forward {forward}: {mine}; {together}"
    else:
        reason = f"TP rank(s) {ranks} faulted at forward {forward}; {together}"
    PATCHES[0].latch_off(reason)
    if rank == 0:  # rank 0 speaks for every rank on the report channel
        from ..report import channel

        for r in range(1, tp):
            why = (f"fault on TP rank {r} at forward {forward} (its log has the error); {together}"
                   if r in faulted else f"TP rank(s) {ranks} faulted at forward {forward}; {together}")
            channel.update_row(str(r), {"patch": PATCH_NAME, "feature": "fp8_stream",
                                        "status": "failed-at-runtime", "reason": why})


def _plan_and_install(core, sizes, *, declined: str, installed: str) -> str:
    """Plan for this rank's layout and install, or keep the stock contract where the plan declines;
    the outcome is logged and recorded (``declined``/``installed``: how the line says it). At TP=2 with
    RADIANCE_FP8_STREAM_FUSED_AR every rank then takes part in the fused epilogue's self-test, installed
    or not, so that the group's collectives match."""
    tp, pp = sizes if sizes is not None else _parallel_sizes()
    _PLANNED[0] = True
    plan = plan_stream(core, tp, pp)
    prove = tp == 2 and pp == 1 and bool(envs.get("RADIANCE_FP8_STREAM_FUSED_AR"))
    done = None
    try:
        if not plan.declined:
            done = contract.install(core, plan, gdn_norm_quant=gdn.enabled(), fused=False)
            done.run.on_agreed = _on_agreed
    finally:
        if prove and sizes is None:  # a layout the caller states (tests) has no group to prove on
            _prove_fused(done)
    if plan.declined:
        line = f"fp8-stream {declined}, stock contract: {plan.declined}"
        logger.warning("radiance: %s", line)
        _record("declined", plan.declined)
        return line
    line = f"fp8-stream {installed}: {done.summary()}"
    logger.info("radiance: %s", line)
    _record("applied", done.summary())
    return line


class LoaderHooks(Hooks):
    """``BaseModelLoader``: the stock load, then the plan on what it loaded."""

    target = _LOADER
    via = VIA

    def load_model(self, *args, **kwargs):
        model = self._orig_load_model(*args, **kwargs)
        self._radiance_fp8_stream_patch.stream(model)
        return model


class TapHooks(Hooks):
    """``EagleModelMixin``: the taps a drafter asks for, then the plan again around them."""

    target = _MIXIN
    via = VIA

    def _set_aux_hidden_state_layers(self, layers, *args, **kwargs):
        result = self._orig__set_aux_hidden_state_layers(layers, *args, **kwargs)
        self._radiance_fp8_stream_patch.replan(self)
        return result


class Qwen35TapHooks(Hooks):
    """``Qwen3_5ForCausalLMBase``, which sets its core's taps past the mixin (hooked where the module
    imports and the class defines the setter itself)."""

    target = "vllm.model_executor.models.qwen3_5.Qwen3_5ForCausalLMBase"
    via = VIA

    def set_aux_hidden_state_layers(self, layers, *args, **kwargs):
        result = self._orig_set_aux_hidden_state_layers(layers, *args, **kwargs)
        self._radiance_fp8_stream_patch.replan(self)
        return result


# Setters of the taps that bypass the mixin's (optional: present when the module imports).
_TAP_SETTERS = (Qwen35TapHooks,)


class Fp8StreamPatch(Patch):
    name = PATCH_NAME
    feature = "fp8_stream"
    # Only class attributes of the loader and of the EAGLE mixin are replaced; the plan is
    # made per loaded model, in whichever process loads one.
    hook_points = (  # replaced
        f"{_LOADER}.load_model",
        f"{_MIXIN}._set_aux_hidden_state_layers",
    )
    relied_on = (  # read or mirrored, never replaced
        f"{_QWEN3_NEXT}.Qwen3NextDecoderLayer.forward",
        f"{_QWEN3_NEXT}.Qwen3NextModel.aux_hidden_state_layers",
        f"{_QWEN3_NEXT}.Qwen3NextRMSNorm",
        "vllm.distributed.tensor_model_parallel_all_reduce",
        "vllm.model_executor.layers.linear.RowParallelLinear.forward",
    )

    def guard(self) -> str | None:
        from vllm.model_executor.layers.layernorm import GemmaRMSNorm

        for path in self.relied_on:
            try:
                resolve(path)
            except LookupError as exc:
                return f"{path} missing ({exc})"
        _, _, norm = resolve(f"{_QWEN3_NEXT}.Qwen3NextRMSNorm")
        if norm is not GemmaRMSNorm:
            return f"Qwen3NextRMSNorm is {norm.__name__}, not GemmaRMSNorm: add_rms_quant reproduces the latter"
        return None

    def after_load(self, runner) -> str | None:
        if _PLANNED[0]:
            return None
        model = getattr(runner, "model", None)
        return (f"the target ({type(model).__name__}) has no Qwen3-Next decoder core: nothing streams, "
                "stock contract")

    def on_ranks_disagree(self, model) -> str | None:
        """Ranks that stream and ranks that do not would all-reduce partial sums against full ones:
        every rank takes the contract off."""
        core = find_core(model) if model is not None else None
        if core is not None:
            contract.uninstall(core)
        return "fp8-stream taken off on every rank (stock contract)"

    def apply(self) -> None:
        self.hook(LoaderHooks)
        self.hook(TapHooks)
        for hooks in _TAP_SETTERS:
            try:
                owner = resolve(hooks.target)[2]
            except LookupError:
                continue
            if all(name in vars(owner) for name in hooks.replacements()):
                self.hook(hooks, owner)

    def stream(self, model) -> None:
        """After the stock load: plan and install on ``model``; never fails a load (stock contract
        instead, latched off)."""
        if self.latched_off:
            return
        try:
            install_on(model)
        except Exception as exc:  # never fail a load: stock contract instead
            core = find_core(model)
            if core is not None:
                contract.uninstall(core)
            self.latch_off(f"install raised {type(exc).__name__}: {exc}")

    def replan(self, model) -> None:
        """The taps of ``model`` were set: plan its core again around them (stock contract, never a
        broken model, if that raises)."""
        core = find_core(model)
        if core is not None and not self.latched_off:
            try:
                replan_for_taps(core)
            except Exception as exc:  # stock contract, never a broken model
                contract.uninstall(core)
                self.latch_off(f"re-planning around taps raised {type(exc).__name__}: {exc}")


PATCHES = [Fp8StreamPatch()]
