"""w4-drafter: the drafter's dense linears in 4 bits (W4A16), converted while the drafter loads.

Why it is safe for the drafter and not for the target: a drafter only proposes; the target
verifies every token, so a weight error costs acceptance, never correctness. Whether the
acceptance cost is worth the bytes is measured by the gate, not argued here.

Where it hooks (vLLM 0.32.0):

``UnquantizedLinearMethod.process_weights_after_loading`` and
``Fp8LinearMethod.process_weights_after_loading`` (``Bf16WeightHooks``, ``BlockFp8WeightHooks``), and the
same method of the three ``radiance_fp8`` linear methods (``FP8_STREAM_METHODS``, where the plugin
registered them)
    while ``DRAFT_SCOPE`` is active (inside the drafter's ``_get_model``; see ``scope``),
    an eligible linear is quantised from its just-loaded weight -- bf16/fp16 directly, a
    block-fp8 checkpoint dequantised with its own block scales first -- *instead of* the
    stock processing (which on CPU would pack the weight into oneDNN and free it, and for
    fp8 would re-lay it out for its kernel). Outside the bracket, and for every layer that
    is declined, the stock method runs untouched. The target is loaded before the drafter,
    outside the bracket, so it is never converted.
    Why the radiance_fp8 methods: an MTP drafter is built with the *target's* quant config
    (vLLM's Qwen3.5 / Qwen3-Next MTP modules take ``vllm_config.quant_config``), so under
    ``model.quantization: radiance_fp8`` -- which fp8-stream needs -- its linears carry those
    methods, not vLLM's. The drafter then gets 4-bit weights while the target streams fp8.

What is declined, and logged once per shape:
    ``fc`` (MTP and DFlash): it combines the target's hidden states over the step's whole
    token count, prefill chunks included, and a weight-streaming kernel re-reads the weight
    per 64 rows; MoE router gates (``gate``, ``shared_expert_gate``): tiny, and routing is
    the sensitive part; layers whose K is not a multiple of the group size; per-tensor fp8
    and pre-processed weights; a block-fp8 DFlash drafter's ``qkv_proj`` (vLLM fuses its context
    K/V projection only for bf16 weights, so there it sees the context token count). MoE
    experts are not linears (FusedMoE) and stay as they are.
    If a drafter load converts nothing, the feature reports itself declined; so does a worker that
    loads no drafter (``after_load``).

Knobs: RADIANCE_W4_DRAFTER (on/off), RADIANCE_W4_GROUP_SIZE (G).
"""
from __future__ import annotations

import logging

import torch

from .. import envs
from ..patching import Hooks, Outcome, Patch, report, resolve
from ..kernels import w4_layout as layout
from . import convert
from .scope import DRAFT_SCOPE

logger = logging.getLogger("radiance")

_UNQUANT = "vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading"
_FP8 = "vllm.model_executor.layers.quantization.fp8.Fp8LinearMethod.process_weights_after_loading"
VIA = "_radiance_w4_drafter"
# The radiance_fp8 linear methods (fp8_stream/linear.py, block.py) and what their weight is when
# process_weights_after_loading runs: bf16 as loaded, or the checkpoint's block fp8.
FP8_STREAM_METHODS = (
    ("radiance.fp8_stream.linear.Fp8StreamLinearMethod.process_weights_after_loading", "bf16"),
    ("radiance.fp8_stream.block.KeptLinearMethod.process_weights_after_loading", "bf16"),
    ("radiance.fp8_stream.block.BlockFp8StreamLinearMethod.process_weights_after_loading", "fp8"),
)

# Last component of a layer's prefix -> why it is never converted.
DECLINED_NAMES = {
    "fc": "sees the step's whole token count (prefill chunks) every step",
    "gate": "MoE router (tiny; routing is the sensitive part)",
    "shared_expert_gate": "MoE gate (tiny)",
}


def group_size_problem(g: int) -> str | None:
    try:
        layout.check_group_size(g, g)
    except ValueError as exc:
        return str(exc)
    return None


def w4_guard(patch: Patch) -> str | None:
    """The guard both 4-bit patches (w4-drafter, int4-head) share: G read into
    ``patch.group_size`` and checked against the kernel, and the drafter-load bracket installed
    (both use it to tell the drafter's load from the target's)."""
    try:
        patch.group_size = envs.get("RADIANCE_W4_GROUP_SIZE")
    except envs.KnobError as exc:
        return str(exc)
    problem = group_size_problem(patch.group_size)
    if problem:
        return f"RADIANCE_W4_GROUP_SIZE={patch.group_size}: {problem}"
    if not DRAFT_SCOPE.applied:
        return "the drafter-load bracket (w4.draft_scope) is not installed"
    return None


class Bf16WeightHooks(Hooks):
    """A linear method whose weight is bf16 (or fp16/fp32) when it is processed: ``UnquantizedLinearMethod``,
    and the radiance_fp8 methods that load a bf16 checkpoint."""

    target = _UNQUANT.rsplit(".", 1)[0]
    via = VIA

    def process_weights_after_loading(self, layer):
        if self._radiance_w4_drafter.converts(self, layer, "bf16"):
            return None
        return self._orig_process_weights_after_loading(layer)


class BlockFp8WeightHooks(Hooks):
    """A linear method whose weight is the checkpoint's block fp8: ``Fp8LinearMethod``, and radiance_fp8's
    block method."""

    target = _FP8.rsplit(".", 1)[0]
    via = VIA

    def process_weights_after_loading(self, layer):
        if self._radiance_w4_drafter.converts(self, layer, "fp8"):
            return None
        return self._orig_process_weights_after_loading(layer)


HOOKS_FOR = {"bf16": Bf16WeightHooks, "fp8": BlockFp8WeightHooks}


class W4DrafterPatch(Patch):
    name = "w4_drafter.linears"
    feature = "w4_drafter"
    hook_points = (_UNQUANT, "vllm.model_executor.layers.linear.LinearBase")
    optional_hook = _FP8  # wrapped where this vLLM has it (fp8 drafters); the canary checks the pinned one does

    def __init__(self) -> None:
        super().__init__()
        self.group_size = 128
        self._noted: set[tuple] = set()
        self._load = {"converted": 0, "declined": 0, "before": 0, "after": 0}
        self.converted_total = 0

    def guard(self) -> str | None:
        return w4_guard(self)

    def apply(self) -> None:
        self.hook(Bf16WeightHooks)
        try:
            self.hook(BlockFp8WeightHooks, owner=resolve(self.optional_hook)[0])
        except LookupError:
            logger.info("radiance: w4-drafter: no Fp8LinearMethod in this vLLM; bf16 drafters only")
        for path, kind in FP8_STREAM_METHODS:
            try:
                owner = resolve(path)[0]
            except LookupError:  # radiance_fp8 not registered in this process: nothing uses them
                continue
            self.hook(HOOKS_FOR[kind], owner=owner)
        DRAFT_SCOPE.on_exit(self._load_finished)

    def revert(self) -> None:
        DRAFT_SCOPE.off_exit(self._load_finished)
        super().revert()

    # -- hooks ------------------------------------------------------------------------
    def converts(self, method, layer, kind: str) -> bool:
        """Whether ``layer`` was converted here (then the stock processing must not run): only inside the
        drafter's load, and never once latched off."""
        if self.latched_off or not DRAFT_SCOPE.active():
            return False
        try:
            return self._convert(method, layer, kind)
        except Exception as exc:  # fail closed: the layer is untouched, stock runs
            self.latch_off(f"converting {getattr(layer, 'prefix', '?')}: {type(exc).__name__}: {exc}")
            return False

    def _load_finished(self) -> None:
        stats, self._load = self._load, {"converted": 0, "declined": 0, "before": 0, "after": 0}
        if stats["converted"] == 0:
            if not self.latched_off:  # a latch has already said why
                reason = (f"the drafter has no convertible linears ({stats['declined']} declined); "
                          "it runs as loaded")
                logger.warning("radiance: w4-drafter declined: %s", reason)
                report().record(Outcome(self.name, self.feature, "declined", reason))
            return
        self.converted_total += stats["converted"]
        logger.info("radiance: w4-drafter converted %d drafter linears: %.1f MiB -> %.1f MiB",
                    stats["converted"], convert.mib(stats["before"]), convert.mib(stats["after"]))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # so vLLM's KV-cache profiling sees the freed weights

    def after_load(self, runner) -> str | None:
        """No drafter load converted anything: none was loaded (no drafter, or one without weights)."""
        if self.converted_total:
            return None
        spec = getattr(runner, "speculative_config", None)
        if spec is None:
            return "no drafter: nothing to convert"
        method = getattr(spec, "method", "?")
        if method != "ngram" and DRAFT_SCOPE.loads == 0:
            return (f"vLLM loaded the {method} drafter outside both loads this patch brackets (V1's "
                    "proposer _get_model, V2's DraftModelSpeculator.load_model): the drafter runs as loaded")
        return f"the {method} drafter loaded no linears this patch converts"

    # -- conversion -------------------------------------------------------------------
    def _note(self, kind: str, layer, shape, verdict: str) -> None:
        key = (kind, tuple(shape), verdict)
        if key not in self._noted:
            self._noted.add(key)
            logger.info("radiance: w4-drafter: %s %s %s: %s", kind, "x".join(map(str, shape)),
                        getattr(layer, "prefix", "") or type(layer).__name__, verdict)

    def decline_reason(self, method, layer, kind: str) -> str | None:
        from vllm.model_executor.layers.linear import LinearBase

        if not isinstance(layer, LinearBase):
            return "not a linear layer"
        last = (getattr(layer, "prefix", "") or "").rsplit(".", 1)[-1]
        if last in DECLINED_NAMES:
            return f"declined: {last} {DECLINED_NAMES[last]}"
        w = getattr(layer, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.is_meta or w.numel() == 0:
            return "declined: no loaded 2-D weight"
        n, k = w.shape
        if k % self.group_size or n < 16:
            return f"declined: K={k} is not a multiple of the group size {self.group_size}" if k % self.group_size \
                else f"declined: N={n} too small to be worth it"
        if kind == "bf16":
            if w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                return f"declined: weight dtype {w.dtype}"
            return None
        if not getattr(method, "block_quant", False):
            return "declined: fp8 without block scales (per-tensor/channel fp8 is not handled)"
        if last == "qkv_proj" and DRAFT_SCOPE.method() == "dflash":
            # vLLM's DFlash fuses the context K/V projection only from a bf16 weight; on a
            # block-fp8 drafter qkv_proj itself sees the context (prefill) tokens every step.
            return "declined: DFlash block-fp8 qkv_proj sees the context token count every step"
        try:
            from vllm.model_executor.utils import is_weights_pre_processed
        except ImportError:
            is_weights_pre_processed = None
        if is_weights_pre_processed is not None and is_weights_pre_processed():
            return "declined: weights arrive pre-processed"
        scale = getattr(layer, "weight_scale_inv", None)
        block = getattr(method, "weight_block_size", None)
        if scale is None or block is None or scale.dim() != 2:
            return "declined: no block scales on the layer"
        bn, bk = int(block[0]), int(block[1])
        if tuple(scale.shape) != (-(-n // bn), -(-k // bk)):
            return f"declined: block scales {tuple(scale.shape)} do not match {n}x{k} / {bn}x{bk}"
        return None

    def _convert(self, method, layer, kind: str) -> bool:
        reason = self.decline_reason(method, layer, kind)
        w = getattr(layer, "weight", None)
        shape = tuple(w.shape) if isinstance(w, torch.Tensor) else ()
        if reason is not None:
            if reason != "not a linear layer":
                self._load["declined"] += 1
                self._note(kind, layer, shape, reason)
            return False
        if kind == "fp8":
            act_dtype = getattr(layer, "orig_dtype", None) or torch.bfloat16
        else:
            act_dtype = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        problem = convert.kernel_self_check(w.device, act_dtype, self.group_size)
        if problem:
            self.latch_off(problem)
            return False
        before = w.numel() * w.element_size()
        if kind == "fp8":
            src = convert.dequant_block_fp8(w.data, layer.weight_scale_inv.data,
                                            tuple(int(b) for b in method.weight_block_size), act_dtype)
        else:
            src = w.data
        qweight, scales = convert.quantize_weight(src, self.group_size, act_dtype)
        del src
        convert.install_packed(layer, method, qweight, scales, self.group_size)
        if kind == "fp8":
            layer.weight_scale_inv = torch.nn.Parameter(
                torch.empty(0, dtype=layer.weight_scale_inv.dtype, device=qweight.device), requires_grad=False)
        after = qweight.numel() * 4 + scales.numel() * scales.element_size()
        self._load["converted"] += 1
        self._load["before"] += before
        self._load["after"] += after
        self._note(kind, layer, shape, f"converted ({convert.mib(before):.1f} -> {convert.mib(after):.1f} MiB)")
        return True


PATCHES = [DRAFT_SCOPE, W4DrafterPatch()]
