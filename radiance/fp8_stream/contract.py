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
class RunState:
    """What every streamed layer of one installed core shares at run time: the fault latch.

    A fault in a site's epilogue (after its all-reduce) leaves that site, and every later one on this
    rank, to the stock arithmetic -- ``norm(all_reduce(partial), residual)``, bf16 into the consumer,
    which quantises as the stock fp8 path does -- so the ranks keep issuing the same all-reduces
    whatever happened locally. The fault is then agreed: the first streamed site of each forward
    (``carrier``) all-reduces one more element with its partial, each rank's bit set if it faulted,
    so every rank learns in the same forward which ranks faulted and latches the stream off there;
    the next forward takes the contract off at its first layer (nothing of it streamed yet) and runs
    stock. Eager execution only: under torch.compile / CUDA graphs this Python runs while vLLM traces,
    where no flag is read (a fault there falls back on its own rank, at the stock arithmetic, and is
    reported by that rank). With the fused two-rank op the faulted rank keeps calling that op until the
    agreement, since its all-reduce is inside it."""
    core: torch.nn.Module | None = None
    carrier: tuple | None = None     # (layer, "in" | "mid"): the site whose all-reduce carries the flags
    fault: str | None = None         # this rank's fault, not yet agreed
    latched: str | None = None       # agreed on every rank: stock from the next forward on
    forwards: int = 0                # forwards whose flags were exchanged (names the step of a latch)
    on_agreed: object = None         # callable(faulted ranks, forward, this rank's fault or None)


@dataclass
class LayerFlags:
    stream_in: bool
    stream_mid: bool
    in_group: int = 0
    in_dtype: torch.dtype = torch.float8_e4m3fn
    mid_group: int = 0
    mid_dtype: torch.dtype = torch.float8_e4m3fn
    fused: bool = False  # the two-rank fused all-reduce epilogue (TP=2, GPU)
    run: RunState = field(default_factory=RunState)


@dataclass
class Installed:
    plan: StreamPlan
    rows: list = field(default_factory=list)      # linears whose reduce_results was turned off
    layers: list = field(default_factory=list)    # layers whose forward was bound
    gdn: list = field(default_factory=list)       # GDN modules given the fused norm + quant
    gdn_refused: dict = field(default_factory=dict)  # {why: [layer indices]} kept stock
    fused: bool = False  # the sites call the two-rank fused all-reduce epilogue
    consumers: dict = field(default_factory=dict)  # {GEMM run on the (q, scale): consumer linears}
    run: RunState = field(default_factory=RunState)
    fused_note: str = ""  # why the fused epilogue is off (its load-time self-test), for the summary

    def summary(self) -> str:
        text = self.plan.summary()
        if self.consumers:
            text += "; consumers: " + ", ".join(f"{n} {g}" for g, n in sorted(self.consumers.items()))
        if self.fused:
            text += "; each all-reduce + epilogue one two-rank kernel"
        if self.fused_note:
            text += f"; {self.fused_note}"
        if self.gdn or self.gdn_refused:
            text += "; " + gdn.summary(self.gdn, self.gdn_refused)
        return text


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(x)


def _norm_quant(reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group: int,
                fp8_dtype):
    """A site's epilogue past its all-reduce: residual add + RMSNorm + fp8 quant."""
    from ..kernels.add_rms_quant import add_rms_quant

    return add_rms_quant(reduced, residual, weight, eps, group, fp8_dtype)


def _exchange_flags(partial: torch.Tensor, run: RunState) -> torch.Tensor:
    """The carrier site's all-reduce, one element longer: each rank adds 2**rank there if it has a fault
    not yet agreed, so every rank reads the same set of faulted ranks in the same forward."""
    from vllm.distributed import get_tensor_model_parallel_rank

    bit = float(1 << get_tensor_model_parallel_rank()) if run.fault else 0.0
    flat = _all_reduce(torch.cat([partial.reshape(-1), partial.new_full((1,), bit)]))
    run.forwards += 1
    mask = int(flat[-1].item())  # a sum of distinct powers of two below 2**8: exact in bf16
    if mask:
        faulted = [r for r in range(mask.bit_length()) if mask >> r & 1]
        mine, run.fault = run.fault, None
        run.latched = f"TP rank(s) {', '.join(map(str, faulted))} faulted at forward {run.forwards}"
        if callable(run.on_agreed):
            run.on_agreed(faulted, run.forwards, mine)
    return flat[:-1].view(partial.shape)


def _carries(layer, site: str, run: RunState) -> bool:
    if run.carrier is None or run.carrier[0] is not layer or run.carrier[1] != site or run.latched:
        return False
    if torch.compiler.is_compiling():
        return False  # traced: no host read of a flag in the graph
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _epilogue(layer, site: str, partial: torch.Tensor, residual: torch.Tensor, norm, group: int, fp8_dtype,
              flags: LayerFlags):
    """all_reduce(partial) + add_rms_quant -> (Fp8Activation, residual); after a fault on this rank, or
    once the ranks agreed on one, the stock arithmetic at the same all-reduce (RunState)."""
    run = flags.run
    if partial.dim() != 2:
        partial = partial.reshape(-1, partial.shape[-1])
    if _carries(layer, site, run):
        reduced = _exchange_flags(partial, run)
    elif flags.fused and not run.latched:
        # the all-reduce and the epilogue are one op here, so a rank with a fault not yet agreed keeps
        # calling it (its peer does: the exchanges must match) until every rank latches at the carrier; a
        # fault inside it cannot be taken back on one rank (the peer's half may have run): not caught
        from .fused_allreduce import allreduce_epilogue

        q, scale, residual = allreduce_epilogue(partial, residual, norm.weight, norm.variance_epsilon, group,
                                                fp8_dtype, True)
        return Fp8Activation(q, scale, partial.dtype), residual
    else:
        reduced = _all_reduce(partial)
    if not (run.fault or run.latched):
        try:
            q, scale, residual_out = _norm_quant(reduced, residual, norm.weight, norm.variance_epsilon, group,
                                                 fp8_dtype)
            return Fp8Activation(q, scale, partial.dtype), residual_out
        except Exception as exc:
            run.fault = f"layer {getattr(layer, 'layer_idx', '?')} {site} epilogue: {type(exc).__name__}: {exc}"
            _say_fault(run.fault)
    return norm(reduced, residual)


def _say_fault(reason: str) -> None:
    import logging

    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        rank = get_tensor_model_parallel_rank()
    except Exception:
        rank = 0
    logging.getLogger("radiance").warning(
        "radiance: fp8-stream fault on TP rank %d (%s); this rank runs the stock arithmetic at the same "
        "all-reduces, and every rank turns the stream off together at the next forward", rank, reason)


def stream_forward(self, hidden_states: torch.Tensor, residual: torch.Tensor | None,
                   positions: torch.Tensor, **kwargs):
    """Qwen3NextDecoderLayer.forward under the fp8-stream contract (bound per instance)."""
    flags: LayerFlags = getattr(self, STATE_ATTR)
    run = flags.run
    if run.latched and residual is None and not flags.stream_in and run.core is not None:
        # a forward's first layer, nothing of it streamed yet: the contract comes off, stock from here
        uninstall(run.core)
        return self.forward(hidden_states=hidden_states, residual=residual, positions=positions, **kwargs)
    if flags.stream_in:
        # hidden_states: the previous layer's un-reduced down_proj output.
        x, residual = _epilogue(self, "in", hidden_states, residual, self.input_layernorm,
                                flags.in_group, flags.in_dtype, flags)
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
        x, residual = _epilogue(self, "mid", attn_out, residual, self.post_attention_layernorm,
                                flags.mid_group, flags.mid_dtype, flags)
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
    done.run.core = core
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
                    fmt_mid.fp8_dtype if fmt_mid else torch.float8_e4m3fn, fused, done.run))
                if done.run.carrier is None:  # the first streamed site in layer order
                    done.run.carrier = (layer, "in" if lp.stream_in else "mid")
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


def set_fused(done: Installed, fused: bool, note: str = "") -> None:
    """Turn the two-rank fused epilogue on or off at every site of an installed core (its load-time
    self-test decides; fused_allreduce.prove)."""
    done.fused = fused
    done.fused_note = note
    for layer in done.layers:
        getattr(layer, STATE_ATTR).fused = fused
