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


# -- prompt logprobs take the serving head path (issue 38: the gate's target check scores through them) ------

@pytest.fixture
def int4_scoring(int4, vllm_cpu):
    from radiance.runner_prompt_logprobs import SCORING

    assert SCORING.install(vllm_cpu.__version__).status == "applied"
    yield int4
    SCORING.revert()


def _partial_head(int4, monkeypatch, limit: int):
    """A head converted under a faked GPU speed plan: 4 bits up to ``limit`` rows, the bf16 head kept."""
    from radiance.lmhead_int4 import speed

    monkeypatch.setattr(int4, "_plan_for", lambda *a: speed.Plan(limit, lost_at=(2 * limit, 90.0, 60.0)))
    head, _ = _head()
    head.quant_method.process_weights_after_loading(head)
    assert isinstance(head.quant_method, Int4HeadMethod) and head.quant_method.w4_max_rows == limit
    return head


def _rowwise_w4(head, h):
    """The 4-bit head applied one row at a time: what no chunking or batching can have touched."""
    return torch.cat([wk.w4a16_gemm_reference(h[i:i + 1], head.w4_qweight, head.w4_scales, 128)
                      for i in range(h.shape[0])])


def _spy_paths(monkeypatch, head):
    """Rows of every 4-bit GEMM call and of every call that went to the kept bf16 head."""
    seen = {"w4": [], "bf16": []}
    gemm, inner = head_patch.w4k.gemm, head.quant_method._inner

    def w4(x, *a):
        seen["w4"].append(x.shape[0])
        return gemm(x, *a)

    class Bf16Spy:
        def __getattr__(self, name):
            return getattr(inner, name)

        def apply(self, layer, x, bias=None):
            seen["bf16"].append(x.shape[0])
            return inner.apply(layer, x, bias)

    monkeypatch.setattr(head_patch.w4k, "gemm", w4)
    head.quant_method._inner = Bf16Spy()
    return seen


def test_chunking_a_head_call_changes_only_the_summation_order():
    """The exactness claim, on this CPU's reference kernel: a row's logits come from that row alone, so a call
    split into chunks gives every row what the 4-bit head gives it alone, up to the float summation order the
    matmul picks for its row count (fp32 activations: ~1e-7 relative; bf16 output: at most one ulp)."""
    from radiance.w4 import quant

    gen = torch.Generator().manual_seed(1)
    w = torch.randn((1000, HIDDEN), generator=gen) * 0.02
    qw, sc = quant.quantize_pack(w, 128, scale_dtype=torch.bfloat16)
    for dtype, rtol, atol in ((torch.float32, 1e-5, 1e-6), (torch.bfloat16, 2 ** -7, 1e-5)):
        x = torch.randn((53, HIDDEN), generator=gen).to(dtype)
        rows = torch.cat([wk.w4a16_gemm_reference(x[i:i + 1], qw, sc, 128) for i in range(53)])
        whole = wk.w4a16_gemm_reference(x, qw, sc, 128)
        chunks = torch.cat([wk.w4a16_gemm_reference(x[a:a + 8], qw, sc, 128) for a in range(0, 53, 8)])
        torch.testing.assert_close(chunks, rows, rtol=rtol, atol=atol)
        torch.testing.assert_close(whole, rows, rtol=rtol, atol=atol)


def test_prompt_logprobs_score_the_4bit_head_in_chunks_and_decode_keeps_the_plan_with_fake_gpu_timings(
        int4_scoring, monkeypatch):
    """A partial plan (4 bits up to 4 rows, faked: the speed rule times heads only on a GPU). vLLM's own V1
    prompt-logprob computation (GPUModelRunner._get_prompt_logprobs_dict, on a runner holding only what it
    reads) over a 23-token prompt: 22 rows, one head call, served by the 4-bit head in calls of <= 4 rows,
    the logprobs those of the 4-bit head applied row by row. A verification call of 6 rows outside it still
    goes to the bf16 head."""
    import numpy as np
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    head = _partial_head(int4_scoring, monkeypatch, limit=4)
    seen = _spy_paths(monkeypatch, head)
    n = 23
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, VOCAB, (n,), generator=gen).tolist()
    hidden = (torch.randn((n, HIDDEN), generator=gen) * 4).to(torch.bfloat16)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head, self.logits_processor = head, LogitsProcessor(VOCAB)
            self.logits: list[torch.Tensor] = []

        def compute_logits(self, h):
            self.logits.append(self.logits_processor(self.lm_head, h))
            return self.logits[-1]

    class Runner(GPUModelRunner):  # vLLM's method on the state it reads; no engine
        def __init__(self):
            self.model, self.device, self.sampler = Model(), torch.device("cpu"), Sampler()
            self.num_prompt_logprobs = {"req-0": 0}
            self.requests = {"req-0": types.SimpleNamespace(prompt_token_ids=prompt, num_computed_tokens=0,
                                                            in_progress_prompt_logprobs_cpu=None)}
            self.input_batch = types.SimpleNamespace(req_id_to_index={"req-0": 0})
            self.query_start_loc = types.SimpleNamespace(np=np.array([0, n]))
            self.model_config = types.SimpleNamespace(logprobs_mode="raw_logprobs")

        def _sync_device(self):
            pass

    runner = Runner()
    out = runner._get_prompt_logprobs_dict(hidden, {"req-0": n})["req-0"]
    assert seen == {"w4": [4, 4, 4, 4, 4, 2], "bf16": []}   # 22 rows, chunks of <= 4, never the bf16 head
    rowwise = _rowwise_w4(head, hidden[:n - 1])[:, :VOCAB]
    torch.testing.assert_close(runner.model.logits[0], rowwise)
    want = rowwise.float().log_softmax(-1).gather(-1, torch.tensor(prompt[1:]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out.logprobs[:, 0], want, rtol=0, atol=2e-3)
    bf16 = torch.nn.functional.linear(hidden[:n - 1], head.weight)[:, :VOCAB].float().log_softmax(-1)
    bf16 = bf16.gather(-1, torch.tensor(prompt[1:]).unsqueeze(-1)).squeeze(-1)
    assert float((out.logprobs[:, 0] - bf16).abs().max()) > 10 * 2e-3   # the bf16 head scores visibly else

    # decode: a verification call above the limit, outside the prompt-logprob computation, keeps the plan
    seen["w4"].clear()
    verify = hidden[:6]
    assert torch.equal(head.quant_method.apply(head, verify), torch.nn.functional.linear(verify, head.weight))
    assert seen == {"w4": [], "bf16": [6]}
    head.quant_method.apply(head, hidden[:3])
    assert seen == {"w4": [3], "bf16": [6]}
    assert "prompt logprobs take the 4-bit head" in patching.report().outcomes[int4_scoring.name].reason


def test_without_the_scoring_scope_a_partial_plan_says_prompt_logprobs_score_bf16(int4, monkeypatch):
    head = _partial_head(int4, monkeypatch, limit=4)
    assert "prompt logprobs score the bf16 head" in patching.report().outcomes[int4.name].reason
    seen = _spy_paths(monkeypatch, head)
    head.quant_method.apply(head, torch.randn(6, HIDDEN).to(torch.bfloat16))
    assert seen == {"w4": [], "bf16": [6]}
