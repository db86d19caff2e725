"""Which weight load is the drafter's: a bracket around the proposer's ``_get_model``.

vLLM 0.32 loads the target first (``GPUModelRunner.load_model`` -> ``get_model``) and then the
drafter (``SpecDecodeBaseProposer.load_model`` -> ``self._get_model()``), in the same process,
through the same loader, so the per-layer hooks (``process_weights_after_loading``) cannot
tell the two apart by themselves. This patch wraps ``_get_model`` so that everything loaded
inside it is known to be the drafter's: the w4-drafter patch converts only inside the
bracket, the int4-head patch only outside it. ``_get_model`` returns before
``_maybe_share_embeddings`` / ``_maybe_share_lm_head`` alias the target's modules into the
drafter, so nothing of the target is ever processed inside the bracket.

The DFlash proposer (``DFlashProposer``) inherits the base ``_get_model``, so a DFlash drafter is
bracketed the same way (tests/e2e/test_w4_dflash.py). Its model builds the fused context-KV
weight inside ``load_weights``, i.e. before ``process_weights_after_loading``: for a bf16
drafter that weight is a bf16 copy taken before conversion, so the context (prefill) K/V
projection stays a dense GEMM and never runs through the 4-bit kernel. For a block-fp8
drafter vLLM builds no fused weight and runs ``qkv_proj`` itself over the context tokens, so
the w4-drafter declines that layer there (the bracket records the proposer's method for it).

Model Runner V2 (GPU only) loads its drafters itself, never through ``_get_model``: its speculator's
``DraftModelSpeculator.load_model`` calls the subclass's ``load_draft_model`` (``load_eagle_model`` for MTP
and EAGLE, ``load_dflash_model``), which calls ``get_model`` and then aliases the target's embedding and head
into the drafter. That method is bracketed too (every V2 speculator that loads a drafter reaches it through
``super().load_model``): the aliasing is an attribute assignment, so nothing of the target is processed
inside it either. Run on V2 on an H100 with the MTP drafter (docs/benchmarks.md, thirteenth session): the
drafter converted (4 linears, fc declined) and the target's 4-bit head shared by it, inside V2's captured draft
graph; both features keep vLLM's default runner there.

One instance (``DRAFT_SCOPE``) is listed in the ``PATCHES`` of both features; the registry
installs it once ("already applied" the second time).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from ..patching import Hooks, Patch, resolve

logger = logging.getLogger("radiance")

_BASE = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer._get_model"
# DraftModelProposer (a separate draft model) overrides _get_model without calling the base.
_OPTIONAL = ("vllm.v1.spec_decode.draft_model.DraftModelProposer._get_model",)
_V2 = "vllm.v1.worker.gpu.spec_decode.speculator.DraftModelSpeculator.load_model"


class ProposerHooks(Hooks):
    """``SpecDecodeBaseProposer``, and each proposer class that defines its own ``_get_model``."""

    target = _BASE.rsplit(".", 1)[0]
    via = "_radiance_draft_scope"

    def _get_model(self, *args, **kwargs):
        # Not ``fail_closed``: the only thing that can raise in here is vLLM's own load, and
        # running that a second time as a "fallback" would be wrong.
        with self._radiance_draft_scope.entered(getattr(self, "method", None)):
            return self._orig__get_model(*args, **kwargs)


class SpeculatorHooks(Hooks):
    """Model Runner V2's ``DraftModelSpeculator``: its drafter load."""

    target = _V2.rsplit(".", 1)[0]
    via = "_radiance_draft_scope"

    def load_model(self, *args, **kwargs):
        # not fail_closed, for the reason ProposerHooks gives
        with self._radiance_draft_scope.entered(getattr(self, "method", None)):
            return self._orig_load_model(*args, **kwargs)


class DraftLoadScope(Patch):
    name = "w4.draft_scope"
    feature = ""
    hook_points = (_BASE,)
    optional_hook = _V2  # V2's drafter load, bracketed where this vLLM has it

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()
        self._exit_hooks: list[Callable[[], None]] = []
        self.loads = 0  # drafter loads bracketed in this process (0 with a drafter: loaded where none is hooked)

    # -- state ------------------------------------------------------------------------
    def active(self) -> bool:
        """True while a drafter's weights are being loaded (in this thread)."""
        return getattr(self._local, "depth", 0) > 0

    def method(self) -> str | None:
        """The speculative method of the drafter being loaded ("mtp", "dflash", ...), if known."""
        return getattr(self._local, "method", None) if self.active() else None

    def on_exit(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when the outermost drafter load returns (once per load)."""
        if hook not in self._exit_hooks:
            self._exit_hooks.append(hook)

    def off_exit(self, hook: Callable[[], None]) -> None:
        if hook in self._exit_hooks:
            self._exit_hooks.remove(hook)

    @contextlib.contextmanager
    def entered(self, method: str | None = None):
        self._local.depth = getattr(self._local, "depth", 0) + 1
        if self._local.depth == 1:
            self.loads += 1
        outer_method = getattr(self._local, "method", None)
        self._local.method = method or outer_method
        try:
            yield
        finally:
            self._local.depth -= 1
            self._local.method = outer_method
            if self._local.depth == 0:
                for hook in list(self._exit_hooks):
                    try:
                        hook()
                    except Exception as exc:  # a summary must never break the load
                        logger.warning("radiance: drafter-load exit hook failed: %s", exc)

    # -- patch ------------------------------------------------------------------------
    def apply(self) -> None:
        for path in (_BASE, *_OPTIONAL):
            try:
                owner = resolve(path)[0]
            except LookupError:
                continue  # optional hook absent in this vLLM: nothing to bracket there
            if path != _BASE and "_get_model" not in vars(owner):
                continue
            # A subclass's own _get_model must not call the base's (DraftModelProposer's does not): the
            # base's hook would read the subclass's original through the instance and call it again.
            self.hook(ProposerHooks, owner)
        try:
            speculator = resolve(_V2)[0]
        except LookupError:
            return  # a vLLM without Model Runner V2's speculators: V1's bracket is all there is
        self.hook(SpeculatorHooks, speculator)


DRAFT_SCOPE = DraftLoadScope()
