"""A patch that runs stock for what was loaded says so: declined at load (no drafter, another
architecture, one draft slot), through the report that radiance/report gathers from every rank."""
from __future__ import annotations

import types

import pytest
import torch

from radiance import patching

pytest.importorskip("vllm")


def _row(name: str) -> dict:
    return next(r for r in patching.report().rows() if r["patch"] == name)


def _runner(spec=None, model=None):
    return types.SimpleNamespace(speculative_config=spec, model=model)


def _spec(method: str, k: int = 4):
    return types.SimpleNamespace(method=method, num_speculative_tokens=k)


def test_dynamic_draft_declines_at_load_for_a_drafter_it_does_not_control():
    from radiance.draft.patch_scheduler import DynamicDraftPatch

    def runner(spec=None, v2=False):
        return types.SimpleNamespace(vllm_config=types.SimpleNamespace(speculative_config=spec,
                                                                       use_v2_model_runner=v2))

    assert "no drafter" in DynamicDraftPatch().after_load(runner())
    assert "the drafter is ngram, not MTP" in DynamicDraftPatch().after_load(runner(_spec("ngram")))
    assert "num_speculative_tokens is 1" in DynamicDraftPatch().after_load(runner(_spec("mtp", 1)))
    assert "Model Runner V2" in DynamicDraftPatch().after_load(runner(_spec("mtp", 4), v2=True))
    own = _spec("mtp", 4)
    own.num_speculative_tokens_per_batch_size = [(1, 8, 4)]
    assert "vLLM's own" in DynamicDraftPatch().after_load(runner(own))
    # asynchronous scheduling is no reason any more: the depth is chosen before the step
    assert DynamicDraftPatch().after_load(runner(_spec("mtp", 4))) is None


def test_w4_drafter_with_no_drafter_declines(monkeypatch):
    from radiance.w4.patch_drafter import W4DrafterPatch
    from radiance.w4.scope import DRAFT_SCOPE

    p = W4DrafterPatch()
    monkeypatch.setattr(DRAFT_SCOPE, "loads", 1)
    assert p.after_load(_runner()) == "no drafter: nothing to convert"
    assert "ngram drafter loaded no linears" in p.after_load(_runner(_spec("ngram")))
    assert "mtp drafter loaded no linears" in p.after_load(_runner(_spec("mtp")))
    p.converted_total = 4
    assert p.after_load(_runner(_spec("mtp"))) is None


def test_w4_drafter_says_when_the_drafter_was_loaded_outside_both_brackets(monkeypatch):
    """Fakes a load that neither V1's proposer nor V2's speculator bracketed: a drafter in the config, no
    bracketed load (a vLLM that moved its drafter load elsewhere)."""
    from radiance.w4.patch_drafter import W4DrafterPatch
    from radiance.w4.scope import DRAFT_SCOPE

    monkeypatch.setattr(DRAFT_SCOPE, "loads", 0)
    why = W4DrafterPatch().after_load(_runner(_spec("dflash")))
    assert "outside both loads" in why and "DraftModelSpeculator.load_model" in why, why
    with DRAFT_SCOPE.entered("mtp"):
        with DRAFT_SCOPE.entered():
            pass
    assert DRAFT_SCOPE.loads == 1  # the outermost entry counts, once
    assert "outside" not in W4DrafterPatch().after_load(_runner(_spec("mtp")))


def test_fp8_stream_on_a_target_with_no_qwen3_next_core_declines(monkeypatch):
    from radiance.fp8_stream import patch as fp8

    class LlamaForCausalLM(torch.nn.Module):
        pass

    monkeypatch.setattr(fp8, "_PLANNED", [False])
    why = fp8.Fp8StreamPatch().after_load(_runner(model=LlamaForCausalLM()))
    assert why.startswith("the target (LlamaForCausalLM) has no Qwen3-Next decoder core"), why
    monkeypatch.setattr(fp8, "_PLANNED", [True])  # planned: the plan's own outcome stands
    assert fp8.Fp8StreamPatch().after_load(_runner(model=LlamaForCausalLM())) is None


def test_settle_after_load_records_declined_only_for_applied_patches(monkeypatch, caplog):
    import radiance.plugin as plugin
    from radiance.report import patch_worker

    class Stocky(patching.Patch):
        name, feature = "test.stocky", "test_feature"

        def after_load(self, runner):
            return "nothing here to patch"

    class Kept(Stocky):
        name = "test.kept"

        def after_load(self, runner):
            raise RuntimeError("boom")  # a failing check keeps the outcome and says so

    patches = [Stocky(), Kept()]
    for p in patches:
        p.applied = True
        patching.report().record(patching.Outcome(p.name, p.feature, "applied"))
    monkeypatch.setattr(plugin, "_registry", patching.Registry(patches))
    with caplog.at_level("WARNING", logger="radiance"):
        patch_worker.settle_after_load(_runner())
    assert _row("test.stocky") == {"patch": "test.stocky", "feature": "test_feature", "status": "declined",
                                   "reason": "nothing here to patch"}
    assert _row("test.kept")["status"] == "applied"
    assert any("declined test_feature (test.stocky): nothing here to patch" in r.message for r in caplog.records)
    assert any("after-load check raised RuntimeError: boom" in r.message for r in caplog.records)
