"""Apply a StreamPlan to a loaded Qwen3NextModel, and take it off again.

Installing changes three things, all per instance (the class stays stock, other models in
the process -- the MTP drafter included -- are untouched):
  * every deferred RowParallel linear gets ``reduce_results = False`` (its output becomes the
    rank's partial sum);
  * every layer with a streamed site gets ``stream_forward`` bound as its ``forward`` and a
    ``_radiance_fp8_stream`` record of its flags;
  * the core remembers what was changed (``_radiance_fp8_stream_installed``) so ``uninstall``
    restores it exactly.
With ``gdn_norm_quant`` (RADIANCE_GDN_NORM_QUANT), qualifying linear-attention modules also get
gdn.py's fused gated-norm + quant ``_output_projection`` (per instance, undone by uninstall).

The layer forward keeps vLLM's contract -- ``(hidden_states, residual)`` in and out -- but
``hidden_states`` may now be a partial sum whose all-reduce the next epilogue performs:
``tensor_model_parallel_all_reduce`` then ``add_rms_quant`` with the norm's own weight and
epsilon, producing ``(q, scale)`` -- wrapped as an ``Fp8Activation`` (activation.py), so the
stock module code between the layer and its linears runs unchanged -- and the new residual.
At TP=2 on GPUs both steps are one op, the fused two-rank kernel (fused_allreduce.py; same
bits), unless RADIANCE_FP8_STREAM_FUSED_AR=0.
The branches the plan's guards exclude (layer_scale, sequence-parallel MoE) are not
reproduced here.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

from . import gdn
from .activation import Fp8Activation
from .plan import StreamPlan, attention_row, consumer_gemms, mlp_row

STATE_ATTR = "_radiance_fp8_stream"
INSTALLED_ATTR = "_radiance_fp8_stream_installed"


@dataclass
class LayerFlags:
    stream_in: bool
    stream_mid: bool
    in_group: int = 0
    in_dtype: torch.dtype = torch.float8_e4m3fn
    mid_group: int = 0
    mid_dtype: torch.dtype = torch.float8_e4m3fn
    fused: bool = False  # the two-rank fused all-reduce epilogue (TP=2, GPU)


@dataclass
class Installed:
    plan: StreamPlan
    rows: list = field(default_factory=list)      # linears whose reduce_results was turned off
    layers: list = field(default_factory=list)    # layers whose forward was bound
    gdn: list = field(default_factory=list)       # GDN modules given the fused norm + quant
    gdn_refused: dict = field(default_factory=dict)  # {why: [layer indices]} kept stock
    fused: bool = False  # the sites call the two-rank fused all-reduce epilogue
    consumers: dict = field(default_factory=dict)  # {GEMM run on the (q, scale): consumer linears}

    def summary(self) -> str:
        text = self.plan.summary()
        if self.consumers:
            text += "; consumers: " + ", ".join(f"{n} {g}" for g, n in sorted(self.consumers.items()))
        if self.fused:
            text += "; each all-reduce + epilogue one two-rank kernel"
        if self.gdn or self.gdn_refused:
            text += "; " + gdn.summary(self.gdn, self.gdn_refused)
        return text


def _epilogue(partial: torch.Tensor, residual: torch.Tensor, norm, group: int, fp8_dtype, fused: bool):
    from .fused_allreduce import allreduce_epilogue

    q, scale, residual = allreduce_epilogue(partial, residual, norm.weight, norm.variance_epsilon, group,
                                            fp8_dtype, fused)
    return Fp8Activation(q, scale, partial.dtype), residual


def stream_forward(self, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                   positions: torch.Tensor, **kwargs):
    """Qwen3NextDecoderLayer.forward under the fp8-stream contract (bound per instance)."""
    flags: LayerFlags = getattr(self, STATE_ATTR)
    if flags.stream_in:
        # hidden_states: the previous layer's un-reduced down_proj output.
        x, residual = _epilogue(hidden_states, residual, self.input_layernorm,
                                flags.in_group, flags.in_dtype, flags.fused)
    elif residual is None:
        residual = hidden_states
        x = self.input_layernorm(hidden_states)
    else:
        x, residual = self.input_layernorm(hidden_states, residual)

    if self.layer_type == "linear_attention":
        attn_out = self.linear_attn(hidden_states=x)
    else:
        attn_out = self.self_attn(hidden_states=x, positions=positions)

    if flags.stream_mid:
        # attn_out: this layer's un-reduced o_proj/out_proj output.
        x, residual = _epilogue(attn_out, residual, self.post_attention_layernorm,
                                flags.mid_group, flags.mid_dtype, flags.fused)
    else:
        x, residual = self.post_attention_layernorm(attn_out, residual)
    return self.mlp(x), residual


def install(core: torch.nn.Module, plan: StreamPlan, gdn_norm_quant: bool = False,
            fused: bool = False) -> Installed:
    """Apply ``plan`` (which must not be declined) to ``core``; all or nothing. With
    ``gdn_norm_quant``, also the fused GDN epilogue wherever gdn.py's guards hold; with
    ``fused``, the sites call the two-rank fused all-reduce epilogue."""
    if plan.declined:
        raise ValueError(f"cannot install a declined plan: {plan.declined}")
    if getattr(core, INSTALLED_ATTR, None) is not None:
        raise RuntimeError("fp8-stream is already installed on this model")
    layers = list(core.layers)
    done = Installed(plan, fused=fused, consumers=consumer_gemms(core, plan))
    setattr(core, INSTALLED_ATTR, done)
    try:
        for layer, lp in zip(layers, plan.layers):
            rows = []
            if lp.stream_mid:
                rows.append(attention_row(layer))
            if lp.defer_down:
                rows.append(mlp_row(layer))
            for row in rows:
                row.reduce_results = False
                done.rows.append(row)
            if lp.patched:
                fmt_in, fmt_mid = lp.in_format, lp.mid_format
                setattr(layer, STATE_ATTR, LayerFlags(
                    lp.stream_in, lp.stream_mid,
                    fmt_in.group_size if fmt_in else 0,
                    fmt_in.fp8_dtype if fmt_in else torch.float8_e4m3fn,
                    fmt_mid.group_size if fmt_mid else 0,
                    fmt_mid.fp8_dtype if fmt_mid else torch.float8_e4m3fn, fused))
                layer.forward = types.MethodType(stream_forward, layer)
                done.layers.append(layer)
        if gdn_norm_quant:
            done.gdn, done.gdn_refused = gdn.install_layers(layers)
    except Exception:
        uninstall(core)
        raise
    return done


def uninstall(core: torch.nn.Module) -> bool:
    """Restore the stock contract; False if nothing was installed."""
    done: Installed | None = getattr(core, INSTALLED_ATTR, None)
    if done is None:
        return False
    for row in done.rows:
        row.reduce_results = True
    for layer in done.layers:
        layer.__dict__.pop("forward", None)
        layer.__dict__.pop(STATE_ATTR, None)
    gdn.uninstall_layers(done.gdn)
    delattr(core, INSTALLED_ATTR)
    return True


def installed(core: torch.nn.Module) -> Installed | None:
    return getattr(core, INSTALLED_ATTR, None)
