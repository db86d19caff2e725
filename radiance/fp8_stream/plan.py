"""Which RowParallel sites of a loaded Qwen3-Next may join the fp8-stream contract.

Pure inspection of the module tree (nothing is changed here): ``plan_stream(core, tp, pp)``
returns a ``StreamPlan`` naming, per decoder layer, the epilogues that may run and, for
every one refused, why. contract.py applies a plan; patch.py makes and logs it after load.

Model-wide guards (any one declines the whole feature, stock contract, one log line):
  * tensor parallel > 1 -- at TP=1 there is no all-reduce for the epilogue to absorb;
  * pipeline parallel == 1 -- the (partial, residual) exchange must not cross a PP boundary;
  * no sequence-parallel MoE (``use_attn_reduce_scatter_for_moe``): its reduce-scatter /
    all-gather replace the all-reduce the epilogue follows.
Auxiliary hidden-state taps (``aux_hidden_state_layers``: DFlash / EAGLE-3 drafters read the
target's ``hidden + residual`` after chosen layers): a tap at index t reads layer t-1's output,
where a deferred ``down`` site would leave a partial sum, so layer t-1's down_proj keeps the stock
contract (and layer t no ``stream_in``); every other site still streams, and the drafter sees
exactly what stock gives it.
Per-layer guards (the layer, and the sites that touch it, keep the stock contract):
  * the layer runs the decoder body contract.py mirrors (``Qwen3NextDecoderLayer.forward``,
    inherited unchanged by Qwen3.5's ``Qwen3_5DecoderLayer``) and its two norms are
    ``GemmaRMSNorm`` (the norm add_rms_quant reproduces);
  * no ``layer_scale`` (the scaled branch sits between the all-reduce and the norm);
  * the MLP has no ``expert_gate`` (a gated shared expert scales the reduced output);
  * every module that receives the norm's output accepts a pre-quantised ``(q, scale)``
    input -- it declares ``radiance_fp8_input = Fp8Input(group_size, fp8_dtype)`` (on itself
    or on its quant_method), and all consumers of one site agree on the format;
  * the RowParallel linear whose all-reduce moves into the epilogue is a plain one
    (``RowParallelLinear``, no bias, ``reduce_results`` on).

Sites, for decoder layer i:
  * ``mid``  -- the attention's o_proj/out_proj all-reduce, then add_rms_quant with the
    layer's post_attention_layernorm weight, into the layer's MLP;
  * ``down`` -- the MLP's down_proj stays a partial sum; layer i+1 starts with the
    all-reduce + add_rms_quant with *its own* input_layernorm weight, into its attention
    (``stream_in`` of layer i+1). Never on the last layer: model.norm and the drafter read
    its output exactly as stock produces it.

Consumers: a linear declares ``radiance_fp8_input`` through its quant method -- the
``radiance_fp8`` method (linear.py) does, vLLM's own methods do not. Full attention: qkv_proj.
GDN attention: its stock forward only asks the input for ``.size(0)``/``.dtype``/``.device``
(an ``Fp8Activation`` answers those) and feeds in_proj_qkvz and in_proj_ba, so those two are
the consumers -- Qwen3-Next's interleaved one-shard projections and Qwen3.5's flat ones (vLLM
fuses its four checkpoint tensors into a 4-shard qkvz and a 2-shard ba) alike (a GDN module
declaring ``radiance_fp8_input`` itself would be taken whole; the LoRA layout with separate
projections declines). Dense MLP (Qwen3.5 in every layer): gate_up_proj. The sparse-MoE
block declares nothing (router, experts and shared expert all read the activation), so its
post-attention site declines, naming the block; an all-MoE model declines as a whole.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

FP8_INPUT_ATTR = "radiance_fp8_input"


@dataclass(frozen=True)
class Fp8Input:
    """What a consumer of a streamed site takes: ``(q [M, K] fp8, scale)`` with per-token
    (group_size 0) or per-128-group scales, in ``fp8_dtype``."""

    group_size: int = 0
    fp8_dtype: torch.dtype = torch.float8_e4m3fn


@dataclass
class LayerPlan:
    index: int
    layer_type: str
    stream_in: bool = False    # finish the previous layer's partial down_proj first
    stream_mid: bool = False   # attention all-reduce + post-attention epilogue into the MLP
    defer_down: bool = False   # leave this layer's down_proj partial (the next layer finishes it)
    in_format: Fp8Input | None = None
    mid_format: Fp8Input | None = None
    reasons: list[str] = field(default_factory=list)  # why a site of this layer stays stock

    @property
    def patched(self) -> bool:
        return self.stream_in or self.stream_mid


@dataclass
class StreamPlan:
    declined: str | None
    layers: list[LayerPlan] = field(default_factory=list)
    taps: tuple[int, ...] = ()  # the aux hidden-state taps the plan was made around

    @property
    def n_in(self) -> int:
        return sum(lp.stream_in for lp in self.layers)

    @property
    def n_mid(self) -> int:
        return sum(lp.stream_mid for lp in self.layers)

    def summary(self) -> str:
        if self.declined:
            return f"declined: {self.declined}"
        stock = [f"{lp.index}: {'; '.join(lp.reasons)}" for lp in self.layers if lp.reasons]
        text = (f"{self.n_in} input + {self.n_mid} post-attention epilogues over "
                f"{len(self.layers)} layers ({self.n_in + self.n_mid} all-reduces fused)")
        if self.taps:
            text += f"; auxiliary hidden-state taps at {list(self.taps)} kept stock"
        return text + (f"; stock sites: {' | '.join(stock)}" if stock else "")


# ---------------------------------------------------------------------------------------
# Module-tree helpers
# ---------------------------------------------------------------------------------------

def find_core(model: torch.nn.Module) -> torch.nn.Module | None:
    """The Qwen3NextModel inside any wrapper (ForCausalLM: .model; multimodal: deeper)."""
    from vllm.model_executor.models.qwen3_next import Qwen3NextModel

    for module in model.modules():
        if isinstance(module, Qwen3NextModel):
            return module
    return None


def fp8_input_of(module: torch.nn.Module | None) -> Fp8Input | None:
    if module is None:
        return None
    spec = getattr(module, FP8_INPUT_ATTR, None)
    if spec is None:
        spec = getattr(getattr(module, "quant_method", None), FP8_INPUT_ATTR, None)
    return spec if isinstance(spec, Fp8Input) else None


def attention_consumers(layer) -> list[tuple[str, torch.nn.Module]]:
    """Modules that receive input_layernorm's output."""
    if layer.layer_type == "full_attention":
        return [("self_attn.qkv_proj", layer.self_attn.qkv_proj)]
    gdn = layer.linear_attn
    if fp8_input_of(gdn) is not None:  # a forward of its own that takes (q, scale)
        return [("linear_attn", gdn)]
    # The stock GDN forward asks its input only for .size(0)/.dtype/.device (an Fp8Activation
    # answers those) and feeds it to its two input projections: those are the consumers.
    # The LoRA layout (separate in_proj_qkv / in_proj_z) has other readers: the module then
    # stays the consumer and declines.
    qkvz, ba = getattr(gdn, "in_proj_qkvz", None), getattr(gdn, "in_proj_ba", None)
    if qkvz is None or ba is None or hasattr(gdn, "in_proj_qkv"):
        return [("linear_attn", gdn)]
    return [("linear_attn.in_proj_qkvz", qkvz), ("linear_attn.in_proj_ba", ba)]


def mlp_consumers(layer) -> list[tuple[str, torch.nn.Module]]:
    """Modules that receive post_attention_layernorm's output."""
    mlp = layer.mlp
    if hasattr(mlp, "gate_up_proj"):  # dense Qwen3NextMLP
        return [("mlp.gate_up_proj", mlp.gate_up_proj)]
    # Sparse MoE: the router, the experts and the shared expert all read the activation.
    return [("mlp", mlp)]


def attention_row(layer) -> torch.nn.Module:
    return layer.self_attn.o_proj if layer.layer_type == "full_attention" else layer.linear_attn.out_proj


def mlp_row(layer) -> torch.nn.Module | None:
    return getattr(layer.mlp, "down_proj", None)  # the MoE block reduces inside FusedMoE


def _row_problem(row, what: str) -> str | None:
    from vllm.model_executor.layers.linear import RowParallelLinear

    if row is None:
        return f"{what}: no RowParallelLinear to defer"
    if not isinstance(row, RowParallelLinear):
        return f"{what}: {type(row).__name__} is not a RowParallelLinear"
    if getattr(row, "bias", None) is not None:
        return f"{what}: has a bias"
    if not row.reduce_results:
        return f"{what}: does not all-reduce"
    return None


def consumer_gemms(core, plan: "StreamPlan") -> dict[str, int]:
    """{GEMM a consumer runs on the epilogue's (q, scale) (its method's ``radiance_gemm``): count} over
    every streamed site's consumers: what the install line reports ("w4a8" under radiance_w4)."""
    counts: dict[str, int] = {}
    for layer, lp in zip(core.layers, plan.layers):
        sites = (attention_consumers(layer) if lp.stream_in else []) + (mlp_consumers(layer) if lp.stream_mid else [])
        for _, module in sites:
            method = getattr(module, "quant_method", module)
            gemm = getattr(method, "radiance_gemm", None) or type(method).__name__
            counts[gemm] = counts.get(gemm, 0) + 1
    return counts


def _consumer_format(consumers, site: str) -> tuple[Fp8Input | None, str | None]:
    formats = []
    for name, module in consumers:
        spec = fp8_input_of(module)
        if spec is None:
            return None, f"{site}: {name} ({type(module).__name__}) takes no pre-quantised input"
        formats.append(spec)
    if any(f != formats[0] for f in formats):
        return None, f"{site}: consumers disagree on the fp8 format {formats}"
    return formats[0], None


def _layer_problem(layer) -> str | None:
    from vllm.model_executor.layers.layernorm import GemmaRMSNorm
    from vllm.model_executor.models.qwen3_next import Qwen3NextDecoderLayer

    if type(layer).forward is not Qwen3NextDecoderLayer.forward:
        return (f"{type(layer).__name__} has its own forward, not the Qwen3NextDecoderLayer body the "
                "contract mirrors")
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = getattr(layer, name, None)
        if not isinstance(norm, GemmaRMSNorm):
            return f"{name} is {type(norm).__name__}, not GemmaRMSNorm (the norm add_rms_quant reproduces)"
    if getattr(layer, "layer_scale", False):
        return "layer_scale is set"
    if getattr(layer, "use_attn_reduce_scatter_for_moe", False):
        return "sequence-parallel MoE"
    if getattr(layer.mlp, "expert_gate", None) is not None:
        return "mlp.expert_gate is set"
    return None


# ---------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------

def taps_of(core) -> tuple[int, ...]:
    return tuple(sorted(set(getattr(core, "aux_hidden_state_layers", ()) or ())))


def model_problem(core, tp_size: int, pp_size: int) -> str | None:
    if tp_size <= 1:
        return f"tensor parallel size is {tp_size}: no all-reduce for the epilogue to absorb"
    if pp_size != 1:
        return f"pipeline parallel size is {pp_size}: the (partial, residual) exchange would cross ranks"
    layers = list(core.layers)
    if not layers:
        return "the decoder has no layers on this rank"
    if any(getattr(layer, "use_attn_reduce_scatter_for_moe", False) for layer in layers):
        return "sequence-parallel MoE replaces the all-reduce with reduce-scatter/all-gather"
    return None


def plan_stream(core, tp_size: int, pp_size: int) -> StreamPlan:
    problem = model_problem(core, tp_size, pp_size)
    if problem:
        return StreamPlan(declined=problem)
    layers = list(core.layers)
    taps = taps_of(core)
    plans = [LayerPlan(i, layer.layer_type) for i, layer in enumerate(layers)]
    own = [_layer_problem(layer) for layer in layers]
    for i, (layer, lp) in enumerate(zip(layers, plans)):
        if own[i]:
            lp.reasons.append(own[i])
            continue
        fmt, why = _consumer_format(mlp_consumers(layer), "post-attention")
        why = why or _row_problem(attention_row(layer), "attention output")
        if why:
            lp.reasons.append(why)
        else:
            lp.stream_mid, lp.mid_format = True, fmt
        if i + 1 == len(layers):
            continue  # the last layer's output goes to model.norm (and the drafter) as stock
        nxt = layers[i + 1]
        if own[i + 1]:
            lp.reasons.append(f"down_proj: next layer stays stock ({own[i + 1]})")
            continue
        if i + 1 in taps:
            lp.reasons.append(f"down_proj: the output of layer {i} is tapped (auxiliary hidden state {i + 1})")
            continue
        fmt, why = _consumer_format(attention_consumers(nxt), f"layer {i + 1} input")
        why = why or _row_problem(mlp_row(layer), "down_proj")
        if why:
            lp.reasons.append(why)
        else:
            lp.defer_down = True
            plans[i + 1].stream_in, plans[i + 1].in_format = True, fmt
    plan = StreamPlan(declined=None, layers=plans, taps=taps)
    if not plan.n_in and not plan.n_mid:
        first = next((f"layer {lp.index}: {lp.reasons[0]}" for lp in plans if lp.reasons), "")
        plan.declined = f"no site qualifies ({first}{', ...' if len(layers) > 1 else ''})"
    return plan
