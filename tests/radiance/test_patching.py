"""The patch machinery against real vLLM classes: apply, decline, revert, latch off."""
import logging

import pytest

from radiance import patching
from radiance.patching import Patch, fail_closed

vllm = pytest.importorskip("vllm")
HOOK = "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer.propose"


class ProbePatch(Patch):
    name = "probe"
    feature = "probe_feature"
    hook_points = (HOOK,)

    def apply(self):
        owner, attr, orig = patching.resolve(HOOK)

        @fail_closed(self, orig)
        def propose(*args, **kwargs):
            raise RuntimeError("boom")

        self.replace(owner, attr, propose)


def test_applies_and_reverts_on_real_vllm_class():
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as EagleProposer

    orig = EagleProposer.propose
    p = ProbePatch()
    out = p.install(vllm.__version__)
    try:
        assert out.status == "applied"
        assert EagleProposer.propose is not orig
        assert EagleProposer._orig_propose is orig
        assert p.install(vllm.__version__).reason == "already applied"
    finally:
        p.revert()
    assert EagleProposer.propose is orig and not hasattr(EagleProposer, "_orig_propose")


def test_missing_hook_point_declines_with_one_log_line(monkeypatch, caplog):
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as EagleProposer

    monkeypatch.delattr(EagleProposer, "propose")
    caplog.set_level(logging.WARNING, logger="radiance")
    out = ProbePatch().install(vllm.__version__)
    assert out.status == "declined" and "hook point" in out.reason and HOOK in out.reason
    lines = [r for r in caplog.records if "declined" in r.getMessage()]
    assert len(lines) == 1 and "probe_feature" in lines[0].getMessage()


def test_version_outside_range_declines():
    out = ProbePatch().install("0.40.1")
    assert out.status == "declined" and "outside the supported range" in out.reason


def test_apply_that_raises_is_undone():
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as EagleProposer

    orig = EagleProposer.propose

    class Half(ProbePatch):
        def apply(self):
            super().apply()
            raise ValueError("half-way")

    out = Half().install(vllm.__version__)
    assert out.status == "declined" and "half-way" in out.reason
    assert EagleProposer.propose is orig


def test_runtime_exception_latches_off_and_runs_original():
    calls = []

    class Box:
        def f(self, x):
            calls.append(x)
            return x * 2

    p = Patch()
    p.name, p.feature = "latch", "latch_feature"

    @fail_closed(p, Box.f)
    def broken(self, x):
        raise RuntimeError("kernel fault")

    Box.f = broken
    assert Box().f(3) == 6 and p.latched_off and "kernel fault" in p.latch_reason
    assert Box().f(4) == 8 and calls == [3, 4]


def test_version_ranges():
    assert patching.version_in_range("0.32.0", "0.32.0", "0.33.0")
    assert patching.version_in_range("0.32.1+cpu", "0.32.0", "0.33.0")
    assert not patching.version_in_range("0.33.0", "0.32.0", "0.33.0")



class Engine:
    """A stand-in for a vLLM class: one method defined here, one inherited."""

    def step(self, n):
        return n + 1


class Child(Engine):
    pass


class EngineHooks(patching.Hooks):
    target = f"{__name__}.Engine"
    via = "_probe_patch"

    def step(self, n):
        return 10 * self._orig_step(n) + self._probe_patch.bonus


class HookingPatch(Patch):
    name = "hooking"
    bonus = 3

    def apply(self):
        self.hook(EngineHooks)


def test_hooks_methods_replace_with_one_self_and_revert():
    orig = Engine.step
    p = HookingPatch()
    p.apply()
    try:
        assert Engine().step(1) == 23 and Child().step(1) == 23  # the original, then the patch's state
        assert Engine._orig_step is orig and Engine._probe_patch is p
        with pytest.raises(RuntimeError, match="replaced already"):  # its original would be lost
            HookingPatch().hook(EngineHooks)
    finally:
        p.revert()
    assert Engine.step is orig and not hasattr(Engine, "_orig_step") and not hasattr(Engine, "_probe_patch")


def test_hooks_on_an_inherited_attribute_revert_by_deleting():
    p = HookingPatch()
    p.hook(EngineHooks, owner=Child)
    assert Child().step(1) == 23 and Engine().step(1) == 2
    p.revert()
    assert "step" not in vars(Child) and "_probe_patch" not in vars(Child) and Child().step(1) == 2


class WrappingPatch(Patch):
    """A closure-style patch on the same attribute (the drafter-load bracket's kind, where a subclass's own
    method calls its hooked parent's): it holds its own original, so hooks may chain over it."""

    name = "wrapping"

    def apply(self):
        orig = Engine.step
        self.replace(Engine, "step", lambda obj, n: orig(obj, n) + 100)


def test_hooks_chain_over_a_closure_replacement_and_both_revert():
    orig = Engine.step
    first, second = WrappingPatch(), HookingPatch()
    first.apply()
    second.apply()                       # not refused: the closure keeps its own original
    try:
        assert Engine().step(1) == 10 * (2 + 100) + 3
    finally:
        second.revert()
        assert Engine().step(1) == 102
        first.revert()
    assert Engine.step is orig and not hasattr(Engine, "_orig_step")


class OuterHooks(patching.Hooks):
    """Another patch's hooks on the attribute EngineHooks replaces (report.engine and dynamic-draft both hook
    Scheduler.update_from_output)."""

    target = f"{__name__}.Engine"
    via = "_outer_patch"

    def step(self, n):
        return self._orig_step(n) + 1000 * self._outer_patch.factor


class OuterPatch(Patch):
    name = "outer"
    factor = 7

    def apply(self):
        self.hook(OuterHooks)


def test_two_patches_hooks_on_one_attribute_chain_and_revert_in_turn():
    orig = Engine.step
    inner, outer = HookingPatch(), OuterPatch()
    inner.apply()
    outer.apply()                        # not refused: the outer hooks read their original under their own name
    try:
        assert Engine().step(1) == (10 * 2 + 3) + 7000 and Child().step(1) == 7023
        assert Engine._orig_step is orig
        with pytest.raises(RuntimeError, match="replaced already"):
            OuterPatch().hook(OuterHooks)    # one via twice: a patch replacing itself
    finally:
        outer.revert()
        assert Engine().step(1) == 23 and Engine._orig_step is orig
        inner.revert()
    assert Engine.step is orig and not hasattr(Engine, "_orig_step") and not hasattr(Engine, "_orig_step_outer_patch")
    assert patching._HOOKED == {}


def test_the_real_loader_takes_int4_head_then_fp8_stream():
    """Both hook BaseModelLoader.load_model: the seeds' deployment has both on, so the second must install over
    the first."""
    from radiance.fp8_stream.patch import Fp8StreamPatch
    from radiance.lmhead_int4.patch import Int4HeadPatch

    a, b = Int4HeadPatch(), Fp8StreamPatch()
    a.apply()
    try:
        b.apply()
        b.revert()
    finally:
        a.revert()
