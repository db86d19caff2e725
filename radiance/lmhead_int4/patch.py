"""int4-head: the target's lm_head quantised to 4 bits (W4A16) right after it loads.

Why: at decode the head is the single largest weight a step reads (248320 x 5120 bf16 is
2.4 GiB, twice per speculative step when the MTP drafter shares it); 4.25 bits per weight
is 0.61 GiB. This changes the target's numerics (the head decides the argmax), so it ships
only behind the accept-length / GSM8K gate; docs/benchmarks.md has the argmax agreement and
top-16 overlap measured offline.

Where it hooks (vLLM 0.32.0): a ``ParallelLMHead`` built without a quant config (Qwen3-Next), or
whose config gives it nothing (Qwen3.5 under ``radiance_fp8`` or vLLM's ``fp8``), carries
``UnquantizedEmbeddingMethod``; a config that leaves the head unquantised on purpose (INC /
AutoRound int4 checkpoints such as the 80B's) gives it ``UnquantizedLinearMethod``. The
``process_weights_after_loading`` of both is hooked (``HeadWeightHooks``). For the target's head (outside the drafter's
load, see ``radiance.w4.scope``) the loaded bf16 weight is quantised in row chunks (group G,
bf16 scales, clip search; ``radiance.w4.quant``) *during* model loading, and the bf16 weight
is freed there, so vLLM's KV-cache profiling, which runs after loading, sees the memory.
The module keeps its name and class; only ``quant_method`` changes, and
``LogitsProcessor`` calls its ``apply``. Vocabulary padding rows are zero and quantise to
zero codes and scales. The MTP drafter aliases the target's head after it loads
(``_maybe_share_lm_head``), so every draft step uses the 4-bit head too.

On a GPU the 4-bit head must also earn its place: it is timed against the bf16 head at every row count
the deployment's head calls have (verification rows B x (k + 1), and the MTP drafter's B rows per slot);
calls above the row count where 4 bits start to lose go to the bf16 weight, which then stays loaded
(recorded as ``partial``), and where they lose at every row count the feature declines
(``radiance.lmhead_int4.speed``). Prompt logprobs are the exception: vLLM computes them in one head call over
every prompt token, far above that row count, and the gate's target check scores through them; those calls
(the runner's prompt-logprob computation, bracketed by ``radiance.runner_prompt_logprobs.SCORING``) take the
4-bit head in calls of at most the plan's row count, so the check measures the head decode serves.

Declined (stock head, one log line, and recorded as the feature's outcome in the report): a head
tied to the input embedding (``tie_word_embeddings`` of the text config: it is also read by
``embedding()``), a ``head_dtype`` override (``LogitsProcessor`` then bypasses ``apply``), any
head whose method is not exactly one of the two unquantised ones (an fp8 or otherwise quantised
head is configured), K not a multiple of G, or a failed kernel self-check. Whether the target's
load converted its head is decided when the load returns (``BaseModelLoader.load_model``,
``LoaderHooks``): a head that never reached a converting hook is declined with its method named.

Knobs: RADIANCE_INT4_HEAD (on/off), RADIANCE_W4_GROUP_SIZE (G).
"""
from __future__ import annotations

import logging

import torch

from ..kernels import w4a16_gemm as w4k
from ..patching import Hooks, Outcome, Patch, report, resolve
from ..runner_prompt_logprobs import SCORING
from ..w4 import convert
from . import speed
from ..w4.patch_drafter import w4_guard
from ..w4.scope import DRAFT_SCOPE

logger = logging.getLogger("radiance")

_EMB = "vllm.model_executor.layers.vocab_parallel_embedding"
_HOOK = f"{_EMB}.UnquantizedEmbeddingMethod.process_weights_after_loading"
_LINEAR_HOOK = "vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading"
_LOADER = "vllm.model_executor.model_loader.base_loader.BaseModelLoader.load_model"
VIA = "_radiance_int4_head"


class Int4HeadMethod(convert.W4Method):
    """lm_head method: logits through the 4-bit GEMM up to ``w4_max_rows`` rows per call, through the
    loaded bf16 weight above (the speed rule's plan); the head is never an embedding.

    Except prompt logprobs: a call the runner makes to compute them (``SCORING`` is active) is served by the
    4-bit head whatever its rows, in calls of at most ``w4_max_rows`` rows, so what the gate's target check
    scores is the head decode uses, not the bf16 one that only large verification calls reach. Each row's
    logits depend on that row alone, so the chunks change which kernel call serves a row, not the weights
    or the arithmetic it goes through; the float result may differ from one whole call in the last bit by
    summation order (the kernel picks its blocking per row count), as decode's own batches already do."""

    def __init__(self, inner, group_size: int, w4_max_rows: int | None = None) -> None:
        super().__init__(inner, group_size)
        self.w4_max_rows = w4_max_rows  # None: every call is 4-bit (the bf16 weight was freed)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        limit = self.w4_max_rows
        if limit is not None and x.numel() // x.shape[-1] > limit:
            if SCORING.active():
                return self._apply_in_chunks(layer, x, bias, limit)
            return self._inner.apply(layer, x, bias)
        return super().apply(layer, x, bias)

    def _apply_in_chunks(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                         rows: int) -> torch.Tensor:
        """The 4-bit head over ``x`` in calls of at most ``rows`` rows, written into one output."""
        x2 = x.reshape(-1, x.shape[-1])
        out = x2.new_empty((x2.shape[0], layer.w4_scales.shape[1]))
        for a in range(0, x2.shape[0], rows):
            out[a:a + rows] = w4k.gemm(x2[a:a + rows], layer.w4_qweight, layer.w4_scales, self.group_size)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias

    def embedding(self, layer: torch.nn.Module, input_: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("radiance int4-head: a 4-bit lm_head cannot be used as an embedding "
                           "(tied heads are declined at load; this one was not tied)")


def _tied(model_config) -> bool:
    """tie_word_embeddings of the text model: a VL wrapper's top-level config may say otherwise."""
    if model_config is None:
        return False
    text = getattr(model_config, "hf_text_config", None) or getattr(model_config, "hf_config", None)
    return bool(getattr(text, "tie_word_embeddings", False))


def _model_config():
    try:
        from vllm.config import get_current_vllm_config

        cfg = get_current_vllm_config()
        return cfg.model_config if cfg is not None else None
    except Exception:
        return None


class HeadWeightHooks(Hooks):
    """The two unquantised methods a head can carry: ``UnquantizedEmbeddingMethod`` (the target) and
    ``UnquantizedLinearMethod`` (hooked onto it too, ``Int4HeadPatch.apply``)."""

    target = _HOOK.rsplit(".", 1)[0]
    via = VIA

    def process_weights_after_loading(self, layer):
        head = self._radiance_int4_head
        try:
            if head.converts(self, layer):
                if getattr(layer.quant_method, "w4_max_rows", None) is not None:
                    # the kept bf16 weight in the runtime form its calls need
                    self._orig_process_weights_after_loading(layer)
                return None
        except Exception as exc:  # fail closed: the head is untouched, stock runs
            head.latch_off(f"converting the lm_head: {type(exc).__name__}: {exc}")
        return self._orig_process_weights_after_loading(layer)


class LoaderHooks(Hooks):
    """``BaseModelLoader``: the target's load returned, so a head that was not converted is a decline."""

    target = _LOADER.rsplit(".", 1)[0]
    via = VIA

    def load_model(self, *args, **kwargs):
        model = self._orig_load_model(*args, **kwargs)
        self._radiance_int4_head.target_loaded(model)
        return model


class Int4HeadPatch(Patch):
    name = "int4_head.lm_head"
    feature = "int4_head"
    hook_points = (
        _HOOK,
        _LINEAR_HOOK,
        _LOADER,
        f"{_EMB}.ParallelLMHead",
        "vllm.model_executor.layers.logits_processor.LogitsProcessor._apply_head",
    )

    def __init__(self) -> None:
        super().__init__()
        self.group_size = 128
        self.converted: list[tuple[str, tuple[int, int]]] = []
        self.declined: dict[str, str] = {}  # head prefix -> why it stayed stock (this load)
        self.speed_rows: list[tuple[int, float, float]] = []  # the speed rule's timings (GPU loads)

    def guard(self) -> str | None:
        return w4_guard(self)

    def apply(self) -> None:
        self.hook(HeadWeightHooks)
        self.hook(HeadWeightHooks, owner=resolve(_LINEAR_HOOK)[0])
        self.hook(LoaderHooks)

    def converts(self, method, layer) -> bool:
        """Whether the target's head ``layer`` was converted here (then the stock processing runs only for a
        kept bf16 weight): outside the drafter's load, and never once latched off."""
        if self.latched_off or DRAFT_SCOPE.active():
            return False
        return self._convert(method, layer)

    def target_loaded(self, model) -> None:
        if not DRAFT_SCOPE.active() and not self.latched_off:
            try:
                self._load_finished(model)
            except Exception as exc:  # a summary must never fail a load
                logger.warning("radiance: int4-head: load summary failed: %s", exc)

    def _load_finished(self, model) -> None:
        """The target has loaded: a head that was not converted is a recorded decline."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        heads = [m for m in model.modules() if isinstance(m, ParallelLMHead)]
        left = [m for m in heads if not hasattr(m, "_radiance_w4")]
        if heads and not left:
            return
        if not heads:
            mc = _model_config()
            reason = ("the head is tied to the input embedding" if _tied(mc)
                      else "the model has no ParallelLMHead on this rank")
        else:
            head = left[0]
            prefix = getattr(head, "prefix", "") or "lm_head"
            reason = self.declined.get(prefix) or (
                f"{prefix}'s method {type(head.quant_method).__name__} is not one int4-head converts "
                "(UnquantizedEmbeddingMethod, UnquantizedLinearMethod)")
        self.declined.clear()
        logger.warning("radiance: int4-head declined: %s", reason)
        report().record(Outcome(self.name, self.feature, "declined", reason))

    def decline_reason(self, method, layer) -> str | None:
        from vllm.model_executor.layers.vocab_parallel_embedding import (
            ParallelLMHead,
            UnquantizedEmbeddingMethod,
        )

        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        if not isinstance(layer, ParallelLMHead):
            return "not an lm_head"
        if type(method) not in (UnquantizedEmbeddingMethod, UnquantizedLinearMethod):
            return f"the head already has a quantised method ({type(method).__name__})"
        w = getattr(layer, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.is_meta or w.numel() == 0:
            return "no loaded 2-D weight"
        if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return f"weight dtype {w.dtype}"
        if w.shape[1] % self.group_size:
            return f"hidden size {w.shape[1]} is not a multiple of the group size {self.group_size}"
        mc = _model_config()
        if mc is not None:
            if _tied(mc):
                return "the head is tied to the input embedding"
            head_dtype = getattr(mc, "head_dtype", None)
            if head_dtype is not None and head_dtype != w.dtype:
                return f"head_dtype={head_dtype} makes LogitsProcessor bypass the head's apply()"
        return None

    def _plan_for(self, method, layer, qweight, scales, act_dtype) -> speed.Plan | None:
        """The speed rule (radiance.lmhead_int4.speed): both heads timed at this deployment's head calls, on a
        GPU; None on a CPU, where every call takes the reference path."""
        w = layer.weight
        if not w.is_cuda:
            return None
        from vllm.config import get_current_vllm_config

        shapes = speed.shapes_from_config(get_current_vllm_config())
        cost = speed.time_rows(lambda x: method.apply(layer, x),
                               lambda x: w4k.gemm(x, qweight, scales, self.group_size),
                               int(w.shape[1]), act_dtype, w.device, speed.step_rows(shapes))
        plan = speed.plan(cost)
        self.speed_rows = speed.step_costs(cost, shapes, plan.w4_max_rows)
        logger.info("radiance: int4-head: head cost per decode step, planned paths / bf16 (k=%d%s; 4-bit up to "
                    "%d rows per call): %s", shapes.k, ", the drafter shares it" if shapes.drafter_shares_head
                    else "", plan.w4_max_rows, speed.summary(self.speed_rows))
        return plan

    def _convert(self, method, layer) -> bool:
        reason = self.decline_reason(method, layer)
        if reason is not None:
            if reason != "not an lm_head":
                prefix = getattr(layer, "prefix", "") or "lm_head"
                self.declined[prefix] = reason
                logger.warning("radiance: int4-head declined for %s: %s", prefix, reason)
            return False
        w = layer.weight
        act_dtype = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        problem = convert.kernel_self_check(w.device, act_dtype, self.group_size)
        if problem:
            self.latch_off(problem)
            return False
        before = w.numel() * w.element_size()
        qweight, scales = convert.quantize_weight(w.data, self.group_size, act_dtype)
        prefix = getattr(layer, "prefix", "") or "lm_head"
        plan = self._plan_for(method, layer, qweight, scales, act_dtype)
        if plan is not None and plan.reason:
            self.declined[prefix] = plan.reason
            logger.warning("radiance: int4-head declined for %s: %s", prefix, plan.reason)
            return False
        keep = plan is not None and plan.keeps_bf16
        convert.install_packed(layer, method, qweight, scales, self.group_size, method_cls=Int4HeadMethod,
                               keep_weight=keep, w4_max_rows=plan.w4_max_rows if keep else None)
        after = qweight.numel() * 4 + scales.numel() * scales.element_size()
        shape = (int(scales.shape[1]), int(w.shape[1]))
        self.converted.append((prefix, shape))
        if keep:
            rows, w4_us, bf_us = plan.lost_at
            why = (f"4-bit for head calls of up to {plan.w4_max_rows} rows, the bf16 head above ({rows} rows: "
                   f"{w4_us:.0f} vs {bf_us:.0f} µs per call); the bf16 head stays loaded (+{after / 2**30:.2f} GiB)")
            why += ("; prompt logprobs take the 4-bit head in calls of up to that many rows" if SCORING.applied
                    else "; prompt logprobs score the bf16 head (the scoring scope was declined)")
            logger.info("radiance: int4-head: %s [%d, %d] -> 4-bit g%d: %s", prefix, shape[0], shape[1],
                        self.group_size, why)
            report().record(Outcome(self.name, self.feature, "partial", why))
            return True
        logger.info("radiance: int4-head: %s [%d, %d] -> 4-bit g%d, %.2f GiB -> %.2f GiB",
                    prefix, shape[0], shape[1], self.group_size, before / 2**30, after / 2**30)
        del w
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # so vLLM's KV-cache profiling sees the freed head
        return True


PATCHES = [DRAFT_SCOPE, SCORING, Int4HeadPatch()]
