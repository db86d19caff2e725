"""int4-head against real vLLM 0.32 classes on CPU: the target's ParallelLMHead is quantised at
load (outside the drafter's load only), logits through LogitsProcessor, padding, declines."""
from __future__ import annotations

import types

import pytest
import torch

from radiance import patching
from radiance.kernels import w4a16_gemm as wk
from radiance.lmhead_int4 import patch as head_patch
from radiance.lmhead_int4.patch import PATCHES, Int4HeadMethod, Int4HeadPatch
from radiance.w4.scope import DRAFT_SCOPE

VOCAB, HIDDEN = 1000, 256


def _head():
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(VOCAB, HIDDEN, params_dtype=torch.bfloat16, disable_tp=True, prefix="lm_head")
    gen = torch.Generator().manual_seed(0)
    w = torch.zeros(head.weight.shape)
    w[:VOCAB] = torch.randn((VOCAB, HIDDEN), generator=gen) * 0.02  # rows past VOCAB: padding
    head.weight.data.copy_(w)
    return head, w


@pytest.fixture
def int4(vllm_cpu, monkeypatch):
    monkeypatch.setenv("RADIANCE_INT4_HEAD", "1")
    monkeypatch.delenv("RADIANCE_W4_GROUP_SIZE", raising=False)
    p = Int4HeadPatch()
    assert DRAFT_SCOPE.install(vllm_cpu.__version__).status == "applied"
    out = p.install(vllm_cpu.__version__)
    assert out.status == "applied", out.reason
    yield p
    p.revert()
    DRAFT_SCOPE.revert()


def test_the_drafter_load_bracket_installs_first():
    assert PATCHES[0] is DRAFT_SCOPE


def test_target_head_is_quantised_at_load_and_serves_logits(int4):
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    head, w = _head()
    assert head.weight.shape[0] > VOCAB  # vLLM pads the vocabulary
    head.quant_method.process_weights_after_loading(head)
    assert isinstance(head.quant_method, Int4HeadMethod) and head.weight.numel() == 0
    assert int4.converted == [("lm_head", (head.w4_scales.shape[1], HIDDEN))]
    h = torch.randn(6, HIDDEN).to(torch.bfloat16)
    raw = head.quant_method.apply(head, h)
    assert torch.equal(raw[:, VOCAB:], torch.zeros_like(raw[:, VOCAB:]))  # padding rows give 0
    torch.testing.assert_close(raw, wk.w4a16_gemm_reference(h, head.w4_qweight, head.w4_scales, 128))
    logits = LogitsProcessor(VOCAB)(head, h)
    assert logits.shape == (6, VOCAB)
    exact = h.float() @ w[:VOCAB].t()
    assert float((logits.float() - exact).norm() / exact.norm()) < 0.15
    with pytest.raises(RuntimeError, match="cannot be used as an embedding"):
        head.quant_method.embedding(head, torch.tensor([1, 2]))


def test_drafter_own_head_is_left_alone(int4):
    head, _ = _head()
    with DRAFT_SCOPE.entered():
        head.quant_method.process_weights_after_loading(head)
    assert not isinstance(head.quant_method, Int4HeadMethod) and head.weight.numel() > 0


@pytest.mark.parametrize("model_config,why", [
    (types.SimpleNamespace(hf_config=types.SimpleNamespace(tie_word_embeddings=True), head_dtype=None), "tied"),
    (types.SimpleNamespace(hf_config=types.SimpleNamespace(tie_word_embeddings=False), head_dtype=torch.float32),
     "head_dtype"),
])
def test_declined_heads_stay_stock(int4, monkeypatch, caplog, model_config, why):
    monkeypatch.setattr(head_patch, "_model_config", lambda: model_config)
    head, _ = _head()
    head.quant_method.process_weights_after_loading(head)
    assert not isinstance(head.quant_method, Int4HeadMethod)
    assert why in caplog.text


def test_an_already_quantised_head_is_not_ours(int4):
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    class OtherHeadMethod(UnquantizedEmbeddingMethod):
        pass

    head, _ = _head()
    head.quant_method = OtherHeadMethod()
    head.quant_method.process_weights_after_loading(head)
    assert isinstance(head.quant_method, OtherHeadMethod)


def test_quantiser_error_fails_closed(int4, monkeypatch):
    from radiance.w4 import convert

    monkeypatch.setattr(convert, "quantize_weight", lambda *a, **k: (_ for _ in ()).throw(MemoryError("oom")))
    head, _ = _head()
    head.quant_method.process_weights_after_loading(head)
    assert int4.latched_off and "oom" in int4.latch_reason
    assert not isinstance(head.quant_method, Int4HeadMethod) and head.weight.numel() > 0


def test_a_head_with_the_unquantized_linear_method_is_converted(int4):
    """INC / AutoRound configs give lm_head UnquantizedLinearMethod on purpose: int4-head takes it too."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    head, _ = _head()
    head.quant_method = UnquantizedLinearMethod()
    head.quant_method.process_weights_after_loading(head)
    assert isinstance(head.quant_method, Int4HeadMethod) and head.weight.numel() == 0


def test_a_head_left_unconverted_is_a_recorded_decline(int4):
    """After the target's load, a head no hook converted is declined in the report, with its reason."""
    from radiance.patching import report
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    class OtherHeadMethod(UnquantizedEmbeddingMethod):
        pass

    head, _ = _head()
    head.quant_method = OtherHeadMethod()
    head.quant_method.process_weights_after_loading(head)
    model = torch.nn.Module()
    model.lm_head = head
    int4._load_finished(model)
    out = report().outcomes[int4.name]
    assert out.status == "declined" and "already has a quantised method (OtherHeadMethod)" in out.reason
    # a converted head leaves the outcome alone
    ok, _ = _head()
    ok.quant_method.process_weights_after_loading(ok)
    model.lm_head = ok
    report().record(patching.Outcome(int4.name, int4.feature, "applied"))
    int4._load_finished(model)
    assert report().outcomes[int4.name].status == "applied"


def test_tie_is_read_from_the_text_config(int4, monkeypatch, caplog):
    """A VL wrapper's top-level config can say untied while the text model is tied."""
    cfg = types.SimpleNamespace(hf_config=types.SimpleNamespace(tie_word_embeddings=False),
                                hf_text_config=types.SimpleNamespace(tie_word_embeddings=True), head_dtype=None)
    monkeypatch.setattr(head_patch, "_model_config", lambda: cfg)
    head, _ = _head()
    head.quant_method.process_weights_after_loading(head)
    assert not isinstance(head.quant_method, Int4HeadMethod) and "tied" in caplog.text


def test_planned_split_sends_large_calls_to_the_kept_bf16_head_with_fake_gpu_timings(int4, monkeypatch):
    """The speed rule times heads only on a GPU; its plan is faked here (4 bits up to 4 rows)."""
    from radiance.lmhead_int4 import speed

    monkeypatch.setattr(int4, "_plan_for", lambda *a: speed.Plan(4, lost_at=(8, 90.0, 60.0)))
    head, w = _head()
    head.quant_method.process_weights_after_loading(head)
    assert isinstance(head.quant_method, Int4HeadMethod) and head.weight.numel() == w.numel()
    small, large = torch.randn(3, HIDDEN).to(torch.bfloat16), torch.randn(6, HIDDEN).to(torch.bfloat16)
    torch.testing.assert_close(head.quant_method.apply(head, small),
                               wk.w4a16_gemm_reference(small, head.w4_qweight, head.w4_scales, 128))
    assert torch.equal(head.quant_method.apply(head, large), torch.nn.functional.linear(large, head.weight))
    row = patching.report().outcomes[int4.name]
    assert row.status == "partial" and "up to 4 rows" in row.reason and "8 rows: 90 vs 60" in row.reason


def test_a_plan_that_never_wins_leaves_the_head_stock_with_fake_gpu_timings(int4, monkeypatch):
    from radiance.lmhead_int4 import speed

    monkeypatch.setattr(int4, "_plan_for", lambda *a: speed.plan({5: (76.0, 23.0), 40: (80.0, 22.0)}))
    head, w = _head()
    method = head.quant_method
    head.quant_method.process_weights_after_loading(head)
    assert head.quant_method is method and not hasattr(head, "w4_qweight")
    assert "already at 5 rows" in int4.declined["lm_head"]
