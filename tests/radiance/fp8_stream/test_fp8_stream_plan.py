"""fp8-stream guards, install/uninstall and the layer forward, against real vLLM 0.32.0
Qwen3-Next modules built on CPU (the tiny test model's config, one gloo rank)."""
from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("vllm")

from radiance.fp8_stream import contract
from radiance.fp8_stream.patch import Fp8StreamPatch, install_on
from radiance.fp8_stream.plan import (
    FP8_INPUT_ATTR,
    Fp8Input,
    _consumer_format,
    attention_consumers,
    attention_row,
    find_core,
    mlp_row,
    plan_stream,
)
from radiance.kernels.add_rms_quant import add_rms_quant_reference
from wrong_sum import planted_wrong_sum

PER_TOKEN = Fp8Input(0, torch.float8_e4m3fn)


@pytest.fixture(scope="module")
def build(shared_cache, tp1_group):
    """build(dense=False, quantized=False) -> a fresh model (uninitialised weights) at TP=1.

    dense=True: only the decoder core (the CausalLM wrapper insists on an MoE layer), every
    MLP dense, so that every site has a linear consumer. quantized=True: the CausalLM with
    layers 0-2 dense and layer 3 MoE (the e2e model's shape), under ``radiance_fp8``."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.qwen3_next import (
        Qwen3NextForCausalLM,
        Qwen3NextModel,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    import radiance.fp8_stream.linear  # noqa: F401  (registers radiance_fp8)
    from tools import tinymodel

    path = str(tinymodel.ensure(shared_cache))
    configs = {}

    def config(dense: bool, quantized: bool) -> VllmConfig:
        key = (dense, quantized)
        if key not in configs:
            overrides, quant = {}, None
            if dense:
                overrides = {"mlp_only_layers": [0, 1, 2, 3]}
            elif quantized:
                overrides, quant = {"mlp_only_layers": [0, 1, 2]}, "radiance_fp8"
            mc = ModelConfig(model=path, dtype="bfloat16", enforce_eager=True, hf_overrides=overrides,
                             quantization=quant)
            configs[key] = VllmConfig(model_config=mc)
        return configs[key]

    def make(dense: bool = False, quantized: bool = False):
        vc = config(dense, quantized)
        # Layers register themselves by name; a rebuilt model would collide with the last.
        vc.compilation_config.static_forward_context.clear()
        with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16):
            if dense:
                return Qwen3NextModel(vllm_config=vc, prefix="model")
            return Qwen3NextForCausalLM(vllm_config=vc, prefix="")

    yield make


@pytest.fixture(scope="module")
def stock_model(build):
    return build(False)


def mark_consumers(core, fmt=PER_TOKEN):
    """What the W8A8 linear method and a tuple-aware GDN would declare."""
    for layer in core.layers:
        for _, module in attention_consumers(layer):
            setattr(module, FP8_INPUT_ATTR, fmt)
        setattr(layer.mlp.gate_up_proj, FP8_INPUT_ATTR, fmt)


@pytest.fixture
def dense_core(build):
    core = find_core(build(True))
    mark_consumers(core)
    return core


# --- model-wide guards -------------------------------------------------------------------

def test_find_core(stock_model):
    core = find_core(stock_model)
    assert type(core).__name__ == "Qwen3NextModel" and len(core.layers) == 4


def test_declines_at_tp1(stock_model):
    assert "tensor parallel size is 1" in plan_stream(find_core(stock_model), 1, 1).declined


def test_declines_with_pipeline_parallel(stock_model):
    assert "pipeline parallel size is 2" in plan_stream(find_core(stock_model), 2, 2).declined


def test_aux_hidden_state_taps_keep_their_boundaries_stock(dense_core):
    """A tap t reads layer t-1's output (hidden + residual): that down site stays reduced, the rest streams."""
    dense_core._set_aux_hidden_state_layers((2, 3))
    try:
        plan = plan_stream(dense_core, 2, 1)
    finally:
        dense_core._set_aux_hidden_state_layers(())
    assert plan.declined is None and plan.taps == (2, 3)
    assert [lp.defer_down for lp in plan.layers] == [True, False, False, False]
    assert [lp.stream_in for lp in plan.layers] == [False, True, False, False]
    assert all(lp.stream_mid for lp in plan.layers)
    assert "the output of layer 1 is tapped (auxiliary hidden state 2)" in plan.summary()
    assert "auxiliary hidden-state taps at [2, 3] kept stock" in plan.summary()


def test_declines_with_sequence_parallel_moe(stock_model, monkeypatch):
    core = find_core(stock_model)
    monkeypatch.setattr(core.layers[2], "use_attn_reduce_scatter_for_moe", True)
    assert "sequence-parallel MoE" in plan_stream(core, 2, 1).declined


def test_stock_qwen3next_declines_naming_the_consumer(stock_model):
    """Unquantised: sparse-MoE MLPs and the GDN's bf16 input projections take no (q, scale)."""
    plan = plan_stream(find_core(stock_model), 2, 1)
    assert plan.declined.startswith("no site qualifies (layer 0: post-attention: mlp "
                                     "(Qwen3NextSparseMoeBlock) takes no pre-quantised input")
    reasons = " ".join(r for lp in plan.layers for r in lp.reasons)
    assert "linear_attn.in_proj_qkvz (MergedColumnParallelLinear)" in reasons
    assert "self_attn.qkv_proj (QKVParallelLinear)" in reasons


# --- under radiance_fp8 ------------------------------------------------------------------

@pytest.fixture(scope="module")
def quantized_model(build):
    return build(quantized=True)


def test_radiance_fp8_methods_on_every_decoder_linear(quantized_model):
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

    from radiance.fp8_stream.linear import Fp8StreamLinearMethod

    kinds = {}
    for name, module in quantized_model.named_modules():
        if isinstance(module, LinearBase):
            kinds[name] = type(module.quant_method)
    # conv1d is built without a quant_config by vLLM itself
    gates = {n for n in kinds if n.endswith((".mlp.gate", ".shared_expert_gate", ".conv1d"))}
    assert gates and all(kinds[n] is UnquantizedLinearMethod for n in gates)
    assert {n: k for n, k in kinds.items() if n not in gates and k is not Fp8StreamLinearMethod} == {}
    assert "model.layers.0.linear_attn.in_proj_ba" in kinds and "model.layers.3.self_attn.qkv_proj" in kinds
    methods = [type(m.quant_method).__name__ for m in quantized_model.model.layers[3].mlp.experts.modules()
               if hasattr(m, "quant_method")]
    moe = [name for name in methods if "MoE" in name]
    assert moe == ["UnquantizedFusedMoEMethod"]  # the routed experts stay stock


def test_plan_qualifies_dense_and_gdn_sites_and_declines_moe(quantized_model):
    """Layers 0-2 dense (GDN attention), layer 3 MoE (full attention): the e2e model's shape."""
    core = find_core(quantized_model)
    assert attention_consumers(core.layers[0])[0][0] == "linear_attn.in_proj_qkvz"
    plan = plan_stream(core, 2, 1)
    assert plan.declined is None
    assert [lp.stream_mid for lp in plan.layers] == [True, True, True, False]
    assert [lp.stream_in for lp in plan.layers] == [False, True, True, True]
    assert [lp.defer_down for lp in plan.layers] == [True, True, True, False]
    moe = "post-attention: mlp (Qwen3NextSparseMoeBlock) takes no pre-quantised input"
    assert plan.layers[3].reasons == [moe]
    assert plan.summary().startswith("3 input + 3 post-attention epilogues over 4 layers")
    assert {lp.in_format for lp in plan.layers if lp.stream_in} == {PER_TOKEN}


def test_gdn_projections_must_agree(quantized_model, monkeypatch):
    gdn = find_core(quantized_model).layers[1].linear_attn
    monkeypatch.setattr(gdn.in_proj_ba.quant_method, FP8_INPUT_ATTR, Fp8Input(128))
    plan = plan_stream(find_core(quantized_model), 2, 1)
    assert not plan.layers[1].stream_in and "disagree" in plan.layers[0].reasons[0]


def test_gdn_with_separate_lora_projections_stays_the_consumer(quantized_model, monkeypatch):
    gdn = find_core(quantized_model).layers[1].linear_attn
    monkeypatch.setattr(gdn, "in_proj_qkv", torch.nn.Identity(), raising=False)
    assert attention_consumers(find_core(quantized_model).layers[1]) == [("linear_attn", gdn)]


# --- per-site decisions ------------------------------------------------------------------

def test_dense_model_with_fp8_consumers_streams_every_site(dense_core):
    plan = plan_stream(dense_core, 2, 1)
    assert plan.declined is None
    assert [lp.stream_mid for lp in plan.layers] == [True] * 4
    assert [lp.stream_in for lp in plan.layers] == [False, True, True, True]
    assert [lp.defer_down for lp in plan.layers] == [True, True, True, False]  # last: stock
    assert (plan.n_in, plan.n_mid) == (3, 4)
    assert "3 input + 4 post-attention epilogues over 4 layers" in plan.summary()


def test_layer_scale_keeps_its_layer_and_neighbour_sites_stock(dense_core):
    dense_core.layers[2].layer_scale = True
    plan = plan_stream(dense_core, 2, 1)
    l1, l2, l3 = plan.layers[1:]
    assert not l2.patched and not l2.defer_down and "layer_scale is set" in l2.reasons
    assert not l1.defer_down and "next layer stays stock (layer_scale is set)" in l1.reasons[0]
    assert not l3.stream_in and l3.stream_mid


def test_expert_gate_declines_the_layer(dense_core):
    dense_core.layers[1].mlp.expert_gate = torch.nn.Linear(4, 1)
    plan = plan_stream(dense_core, 2, 1)
    assert not plan.layers[1].patched and "mlp.expert_gate is set" in plan.layers[1].reasons
    assert not plan.layers[0].defer_down


def test_unmarked_consumer_declines_its_site_only(dense_core):
    delattr(dense_core.layers[3].self_attn.qkv_proj, FP8_INPUT_ATTR)
    plan = plan_stream(dense_core, 2, 1)
    assert not plan.layers[3].stream_in and plan.layers[3].stream_mid
    assert not plan.layers[2].defer_down
    assert any("self_attn.qkv_proj" in r for r in plan.layers[2].reasons)


def test_row_with_bias_or_without_all_reduce_is_not_deferred(dense_core):
    row = attention_row(dense_core.layers[0])
    row.bias = torch.nn.Parameter(torch.zeros(row.output_size_per_partition))
    mlp_row(dense_core.layers[1]).reduce_results = False
    plan = plan_stream(dense_core, 2, 1)
    assert not plan.layers[0].stream_mid and "attention output: has a bias" in plan.layers[0].reasons
    assert not plan.layers[1].defer_down and "down_proj: does not all-reduce" in plan.layers[1].reasons


def test_consumers_must_agree_on_the_format():
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    setattr(a, FP8_INPUT_ATTR, Fp8Input(0))
    setattr(b, FP8_INPUT_ATTR, Fp8Input(128))
    fmt, why = _consumer_format([("a", a), ("b", b)], "site")
    assert fmt is None and "disagree" in why
    setattr(b, FP8_INPUT_ATTR, Fp8Input(0))
    assert _consumer_format([("a", a), ("b", b)], "site") == (Fp8Input(0), None)


# --- install / uninstall -----------------------------------------------------------------

def test_install_and_uninstall_round_trip(dense_core):
    plan = plan_stream(dense_core, 2, 1)
    layers = list(dense_core.layers)
    done = contract.install(dense_core, plan)
    assert len(done.rows) == 4 + 3 and all(not row.reduce_results for row in done.rows)
    assert mlp_row(layers[3]).reduce_results  # the last layer's down_proj still reduces
    assert [("forward" in layer.__dict__) for layer in layers] == [True] * 4
    assert getattr(layers[0], contract.STATE_ATTR).stream_in is False
    with pytest.raises(RuntimeError, match="already installed"):
        contract.install(dense_core, plan)
    assert contract.uninstall(dense_core)
    assert all(row.reduce_results for row in done.rows)
    assert not any("forward" in layer.__dict__ for layer in layers)
    assert contract.installed(dense_core) is None and not contract.uninstall(dense_core)


def test_declined_plan_cannot_be_installed(stock_model):
    core = find_core(stock_model)
    with pytest.raises(ValueError, match="declined"):
        contract.install(core, plan_stream(core, 1, 1))


# --- the layer forward under the contract -------------------------------------------------

class _Recorder(torch.nn.Module):
    """Stands in for attention / MLP: records its input, returns a fixed partial sum."""

    def __init__(self, out: torch.Tensor):
        super().__init__()
        self.out = out
        self.seen = None

    def forward(self, hidden_states=None, positions=None):
        self.seen = hidden_states
        return self.out


def test_stream_forward_dataflow(dense_core, monkeypatch):
    """Partial sums are all-reduced by the next epilogue, with the right norm's weight."""
    torch.manual_seed(0)
    k = dense_core.config.hidden_size
    layer = dense_core.layers[3]  # full attention; stream_in and stream_mid
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.data = (torch.randn(k) * 0.1).to(torch.bfloat16)
    partial_attn = torch.randn(5, k).to(torch.bfloat16)
    partial_mlp = torch.randn(5, k).to(torch.bfloat16)
    reduced = []
    monkeypatch.setattr(contract, "_all_reduce", lambda x: reduced.append(x) or x * 2)
    contract.install(dense_core, plan_stream(dense_core, 2, 1))
    layer.self_attn = _Recorder(partial_attn)
    layer.mlp = _Recorder(partial_mlp)
    try:
        prev_partial = torch.randn(5, k).to(torch.bfloat16)
        residual = (torch.randn(5, k) * 4).to(torch.bfloat16)
        out, new_residual = layer(hidden_states=prev_partial, residual=residual,
                                  positions=torch.arange(5))
    finally:
        contract.uninstall(dense_core)
    assert len(reduced) == 2 and reduced[0] is prev_partial and reduced[1] is partial_attn
    eps = layer.input_layernorm.variance_epsilon
    q1, s1, r1 = add_rms_quant_reference(prev_partial * 2, residual, layer.input_layernorm.weight, eps)
    q2, s2, r2 = add_rms_quant_reference(partial_attn * 2, r1, layer.post_attention_layernorm.weight, eps)
    got_q1, got_s1, dt1 = layer.self_attn.seen  # an Fp8Activation
    assert torch.equal(got_q1.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(got_s1, s1)
    got_q2, got_s2, dt2 = layer.mlp.seen
    assert torch.equal(got_q2.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(got_s2, s2)
    assert dt1 == dt2 == torch.bfloat16 and layer.mlp.seen.size(0) == 5
    assert out is partial_mlp  # stays partial: the next layer (or model.norm) finishes it
    assert torch.equal(new_residual, r2)


def test_a_fault_in_an_epilogue_runs_stock_arithmetic_is_agreed_then_takes_the_contract_off(dense_core,
                                                                                            monkeypatch):
    """One rank (here the only one): the faulted site and every later one run norm(all_reduce(partial))
    at the same all-reduces; the next forward's carrier all-reduce carries the fault, every rank latches
    there; the forward after that takes the contract off at its first layer."""
    torch.manual_seed(1)
    k = dense_core.config.hidden_size
    layer = dense_core.layers[3]
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight.data = (torch.randn(k) * 0.1).to(torch.bfloat16)
    reduced = []
    monkeypatch.setattr(contract, "_all_reduce", lambda x: reduced.append(x.numel()) or x.clone())
    done = contract.install(dense_core, plan_stream(dense_core, 2, 1))
    assert done.run.carrier == (dense_core.layers[0], "mid")  # the first streamed site in layer order
    done.run.carrier = (layer, "in")  # this test drives layer 3 alone
    agreed = []
    done.run.on_agreed = lambda faulted, forward, mine: agreed.append((faulted, forward, mine))
    calls = []

    def faulty(*args):
        calls.append(1)
        raise RuntimeError("planted epilogue fault")

    monkeypatch.setattr(contract, "_norm_quant", faulty)
    layer.self_attn = _Recorder(torch.randn(5, k).to(torch.bfloat16))
    layer.mlp = _Recorder(torch.randn(5, k).to(torch.bfloat16))
    prev = torch.randn(5, k).to(torch.bfloat16)
    residual = (torch.randn(5, k) * 4).to(torch.bfloat16)
    try:
        layer(hidden_states=prev, residual=residual, positions=torch.arange(5))
        # the carrier's all-reduce is one element longer; the fault came after it, at its epilogue
        assert reduced == [5 * k + 1, 5 * k] and len(calls) == 1 and not agreed
        assert done.run.fault.startswith("layer 3 in epilogue: RuntimeError: planted epilogue fault")
        want_x, want_r = layer.input_layernorm(prev.clone(), residual.clone())
        assert torch.equal(layer.self_attn.seen, want_x)  # bf16, the stock norm: the consumer quantises
        layer(hidden_states=prev, residual=residual, positions=torch.arange(5))
        assert len(agreed) == 1 and agreed[0][:2] == ([0], 2)  # rank 0 faulted, agreed at forward 2
        assert agreed[0][2].startswith("layer 3 in epilogue: RuntimeError")
        assert done.run.latched == "TP rank(s) 0 faulted at forward 2" and done.run.fault is None
        assert len(calls) == 1  # latched: no epilogue runs any more
        first = dense_core.layers[0]
        monkeypatch.setattr(type(first), "forward", lambda self, **kw: ("stock", kw["residual"]))
        assert first(hidden_states=prev, residual=None, positions=torch.arange(5)) == ("stock", None)
        assert contract.installed(dense_core) is None  # taken off at the forward's first layer
    finally:
        contract.uninstall(dense_core)


def test_fused_epilogue_self_test_passes_and_a_planted_difference_fails_it(dense_core, monkeypatch):
    """prove() on this process's one-rank group: the op against the group's all-reduce + add_rms_quant,
    bit for bit (a one-rank group is enough for the comparison and the verdict gather)."""
    from radiance.fp8_stream import fused_allreduce as fa

    k = dense_core.config.hidden_size
    weight = (torch.randn(k) * 0.1).to(torch.bfloat16)
    monkeypatch.setattr(fa, "_PROVEN", {})
    assert fa.prove(weight, 1e-6, 0, torch.float8_e4m3fn, torch.bfloat16, torch.device("cpu")) == (True, "")
    monkeypatch.setattr(fa, "_TP2_OP", planted_wrong_sum(fa._TP2_OP, 3))
    monkeypatch.setattr(fa, "_PROVEN", {})
    ok, why = fa.prove(weight, 1e-6, 0, torch.float8_e4m3fn, torch.bfloat16, torch.device("cpu"))
    assert not ok and why == (f"rank 0: M=1: sum (new residual): 1 of {k} differ against gloo's all-reduce "
                              "+ add_rms_quant"), why
    monkeypatch.setattr(fa, "_PROVEN", {})
    ok, why = fa.prove(None, 1e-6, 0, torch.float8_e4m3fn, torch.bfloat16, torch.device("cpu"))
    assert not ok and why == "rank 0: the stream is not installed on this rank"


# --- the Patch -----------------------------------------------------------------------------

def test_guard_accepts_the_pinned_vllm_norm():
    assert Fp8StreamPatch().guard() is None   # Qwen3NextRMSNorm is GemmaRMSNorm (hooks: test_hook_points.py)


def test_install_on_logs_one_line(stock_model, dense_core, caplog):
    caplog.set_level(logging.INFO, logger="radiance")
    line = install_on(stock_model, sizes=(1, 1))
    assert line.startswith("fp8-stream declined, stock contract: tensor parallel size is 1")
    assert [r.getMessage() for r in caplog.records] == [f"radiance: {line}"]
    assert install_on(torch.nn.Linear(2, 2), sizes=(2, 1)) == "not a Qwen3-Next model"
    line = install_on(dense_core, sizes=(2, 1))
    try:
        assert line.startswith("fp8-stream installed: 3 input + 4 post-attention")
        assert contract.installed(dense_core) is not None
    finally:
        contract.uninstall(dense_core)


def test_aux_taps_after_install_replan_around_them(dense_core, caplog, monkeypatch):
    from radiance.fp8_stream import patch as patch_mod

    monkeypatch.setattr(patch_mod, "_parallel_sizes", lambda: (2, 1))
    caplog.set_level(logging.INFO, logger="radiance")
    patch = Fp8StreamPatch()
    patch.apply()
    try:
        contract.install(dense_core, plan_stream(dense_core, 2, 1))
        assert dense_core.layers[1].mlp.down_proj.reduce_results is False
        dense_core._set_aux_hidden_state_layers((2,))
        done = contract.installed(dense_core)
        assert done is not None and done.plan.taps == (2,)
        # the tapped boundary is stock again, the others still stream
        assert dense_core.layers[1].mlp.down_proj.reduce_results is True
        assert dense_core.layers[0].mlp.down_proj.reduce_results is False
        assert "installed again around the auxiliary hidden-state taps" in caplog.text
    finally:
        patch.revert()
        contract.uninstall(dense_core)
        dense_core._set_aux_hidden_state_layers(())
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.models.interfaces import EagleModelMixin

    assert not hasattr(BaseModelLoader, "_orig_load_model")
    assert not hasattr(EagleModelMixin, "_orig__set_aux_hidden_state_layers")


def test_the_loader_hook_streams_what_was_loaded_and_fails_closed(dense_core, monkeypatch):
    """``LoaderHooks.load_model`` on a stand-in loader: the stock load, then the plan; an install that
    raises leaves the loaded model stock and latches the patch off."""
    from radiance.fp8_stream import patch as patch_mod

    monkeypatch.setattr(patch_mod, "_parallel_sizes", lambda: (2, 1))
    monkeypatch.setenv("RADIANCE_FP8_STREAM_FUSED_AR", "0")

    class Loader:
        def load_model(self, *args, **kwargs):
            return dense_core

    patch = Fp8StreamPatch()
    patch.hook(patch_mod.LoaderHooks, owner=Loader)
    try:
        assert Loader().load_model() is dense_core and contract.installed(dense_core) is not None
        contract.uninstall(dense_core)

        def boom(model, sizes=None):
            raise RuntimeError("planted")

        monkeypatch.setattr(patch_mod, "install_on", boom)
        assert Loader().load_model() is dense_core and contract.installed(dense_core) is None
        assert patch.latched_off and patch.latch_reason == "install raised RuntimeError: planted"
    finally:
        patch.revert()
        contract.uninstall(dense_core)
    assert not hasattr(Loader, "_orig_load_model")


def test_patch_declines_when_a_relied_on_attribute_is_gone(monkeypatch):
    import vllm

    patch = Fp8StreamPatch()
    monkeypatch.setattr(patch, "relied_on", patch.relied_on + ("vllm.distributed.no_such_thing",))
    assert "vllm.distributed.no_such_thing missing" in patch.check(vllm.__version__)
