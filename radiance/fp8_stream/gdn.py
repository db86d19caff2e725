"""The GDN gated-norm + quant epilogue (RADIANCE_GDN_NORM_QUANT=1, on top of the contract).

Stock ``QwenGatedDeltaNetAttention._output_projection(core_attn_out, z)`` runs
``self.norm(core_attn_out, z)`` (RMSNormGated, per head, silu gate) and hands the bf16 result
to out_proj, whose W8A8 method quantises it again. Here a linear-attention layer whose guards
hold gets a per-instance ``_output_projection`` that runs ``radiance.kernels.gdn_norm_quant``
(norm + gate + fp8 quant, one launch) and hands out_proj an ``Fp8Activation``; the class and
every other instance stay stock, and ``uninstall_layers`` takes the binding off again.

Guards (each refused layer keeps the stock path; the install line names why, once):
  * the norm is the one the kernel reproduces: ``group_size`` None, ``norm_before_gate``,
    activation silu/swish (sigmoid gating is not taken), no bias, a 1-D bf16 weight of
    ``head_v_dim`` elements with ``head_v_dim`` a power of two in the kernel's range;
  * out_proj declares ``radiance_fp8_input`` (plan.py's ``fp8_input_of``), has no bias, and,
    for group scales, its K per rank is a multiple of the group;
  * no fused spec-decode GDN kernel (on CUDA with speculative decoding vLLM fuses the norm
    into the attention kernel and never calls ``_output_projection``);
  * nobody else bound ``_output_projection`` on the instance already.

Off by default: the kernel matches vLLM's CPU RMSNormGated to about 3 bf16 values in 10^6
(one ulp; fp8 codes ~1 in 10^6-10^7, scales exact; tests/radiance/kernels/
test_gdn_norm_quant.py measures it), so the e2e TP=2 identity test against the stock fp8
path could see a different token.
"""
from __future__ import annotations

import types

import torch

from .activation import Fp8Activation
from .plan import Fp8Input, fp8_input_of

GDN_ATTR = "_radiance_gdn_norm_quant"
KNOB = "RADIANCE_GDN_NORM_QUANT"


def enabled() -> bool:
    from radiance import envs

    return bool(envs.get(KNOB))


def gdn_problem(la) -> str | None:
    """Why ``la`` (a linear-attention module) cannot take the fused epilogue, or None."""
    from radiance.kernels.gdn_norm_quant import HEAD_DIMS

    norm, out_proj = getattr(la, "norm", None), getattr(la, "out_proj", None)
    if norm is None or out_proj is None or not hasattr(la, "_output_projection"):
        return "no norm / out_proj / _output_projection"
    if "_output_projection" in vars(la):
        return "_output_projection is already bound on the instance"
    if getattr(norm, "group_size", None) is not None:
        return f"norm group_size={norm.group_size} (the kernel normalises whole heads)"
    if not getattr(norm, "norm_before_gate", False):
        return "norm gates before normalising (norm_before_gate=False)"
    act = getattr(norm, "activation", None)
    if act not in ("silu", "swish"):
        return f"norm activation {act!r} (the kernel gates with silu)"
    if getattr(norm, "bias", None) is not None:
        return "norm has a bias"
    weight = getattr(norm, "weight", None)
    d = getattr(la, "head_v_dim", None)
    if weight is None or weight.dim() != 1 or weight.numel() != d or d not in HEAD_DIMS:
        return f"norm weight {None if weight is None else tuple(weight.shape)} for head_v_dim {d} " \
               f"(the kernel takes D in {HEAD_DIMS})"
    if weight.dtype != torch.bfloat16:
        return f"norm weight dtype {weight.dtype} (the kernel rounds to bf16 activations)"
    spec = fp8_input_of(out_proj)
    if spec is None:
        return f"out_proj ({type(getattr(out_proj, 'quant_method', None)).__name__}) takes no pre-quantised input"
    if getattr(out_proj, "bias", None) is not None:
        return "out_proj has a bias"
    k = getattr(out_proj, "input_size_per_partition", None)
    if k is None or k % d:
        return f"out_proj K per rank {k} is not whole heads of {d}"
    if spec.group_size and k % spec.group_size:
        return f"out_proj K per rank {k} is not a multiple of its group {spec.group_size}"
    if getattr(la, "enable_fused_gdn_spec_decode", False):
        return "the fused spec-decode GDN kernel applies the norm itself"
    return None


def gdn_output_projection(self, core_attn_out: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``_output_projection`` under the epilogue (bound per instance)."""
    from radiance.kernels.gdn_norm_quant import gdn_norm_quant

    spec: Fp8Input = getattr(self, GDN_ATTR)
    t = core_attn_out.shape[0]
    q, scale = gdn_norm_quant(core_attn_out.reshape(t, -1), z.reshape(t, -1), self.norm.weight,
                              self.norm.eps, spec.group_size, spec.fp8_dtype)
    output, _ = self.out_proj(Fp8Activation(q, scale, core_attn_out.dtype))
    return output


def install_layers(layers) -> tuple[list, dict[str, list[int]]]:
    """Binds the epilogue on every linear-attention layer whose guards hold. Returns (the
    modules bound, {reason: [layer indices]} for those refused)."""
    bound, refused = [], {}
    try:
        for i, layer in enumerate(layers):
            if getattr(layer, "layer_type", None) != "linear_attention":
                continue
            la = layer.linear_attn
            why = gdn_problem(la)
            if why:
                refused.setdefault(why, []).append(i)
                continue
            setattr(la, GDN_ATTR, fp8_input_of(la.out_proj))
            la._output_projection = types.MethodType(gdn_output_projection, la)
            bound.append(la)
    except Exception:
        uninstall_layers(bound)
        raise
    return bound, refused


def uninstall_layers(bound) -> None:
    for la in bound:
        la.__dict__.pop("_output_projection", None)
        la.__dict__.pop(GDN_ATTR, None)


def summary(bound, refused: dict[str, list[int]]) -> str:
    text = f"{len(bound)} gdn norm+quant epilogues"
    if refused:
        text += " (stock: " + " | ".join(f"layers {','.join(map(str, idx))}: {why}"
                                         for why, idx in refused.items()) + ")"
    return text
