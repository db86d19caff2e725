"""``radiance_fp8``: W8A8 fp8 linears that take (q, scale) -- for bf16 checkpoints quantised
online at load, and for block-fp8 checkpoints (block.py).

vLLM's own fp8 methods quantise their input inside ``apply``, so an fp8-stream epilogue has
nobody to hand its ``(q, scale)`` to. This out-of-tree quantization config (registered with
vLLM's ``register_quantization_config`` as ``QUANT_NAME`` by the plugin, in every process)
gives every decoder linear a method that takes either a plain tensor (quantised inside: with
fp8-stream off this IS the "stock fp8 path" the contract is compared against) or an
``Fp8Activation`` from an epilogue (used as is, no second quantisation). Which mode runs is
decided by the checkpoint:

* bf16 checkpoint (no ``quantization_config``; ``from_config`` returns this class): weights
  quantised at ``process_weights_after_loading`` (after the TP shard was loaded, so each
  rank's rows get their own scales), per output channel, fp8 format of the device
  (``fp8_dtype_for_device``); activations per token with ``quant_fp8`` (the quant half of
  ``add_rms_quant``, vLLM's QuantFP8 arithmetic; one launch on a GPU, ``quantize_reference``
  on CPU). Declares ``Fp8Input(0, dtype)``.
* block-fp8 checkpoint (``quant_method: fp8``, dynamic activations, ``weight_block_size:
  [128, 128]``): ``override_quantization_method`` -- vLLM's ModelConfig asks every registered
  config while resolving ``--quantization`` against the checkpoint's ``quantization_config``
  -- claims it when the user asked for ``radiance_fp8`` (without the flag vLLM's own ``fp8``
  serves it), or refuses it with a ValueError naming the field; ``from_config`` then returns
  block.py's ``Fp8StreamBlockConfig``: the file's e4m3 weights and 128x128 inverse scales
  loaded as stored, activations per token-group of 128, ``Fp8Input(128, dtype)``; unconverted
  consumers (GDN in_proj_ba, ...) keep their bf16 weights and dequantise the group-128 input.

The GEMM is ``torch.ops.radiance.fp8_gemm`` (``_scaled_mm`` / Triton on a GPU, the reference
on CPU). plan.py reads ``radiance_fp8_input`` to decide which sites may stream.

Left unquantised in the bf16 mode (``UnquantizedLinearMethod`` or None, as vLLM's configs
do): a VL model's vision tower (``visual.*``), the MoE router gate and the shared-expert gate
(tiny, and they feed a softmax/sigmoid),
lm_head and the embeddings (not LinearBase here), the routed experts (FusedMoE keeps its
stock method, so sparse-MoE sites decline in the plan), attention KV caches. In the block
mode the checkpoint's ``modules_to_not_convert`` decides, and experts / KV caches get what
vLLM's ``Fp8Config`` gives them.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization import register_quantization_config

from radiance.kernels.dispatch import fp8_dtype_for_device
from radiance.kernels.fp8_common import quantize_reference
from radiance.kernels.fp8_gemm import scaled_mm

from .activation import Fp8Activation
from .base import QUANT_NAME, Fp8InputMethod, Fp8StreamConfigBase, as_codes, skipped
from .block import Fp8StreamBlockConfig, checkpoint_problem
from .plan import FP8_INPUT_ATTR, Fp8Input

class Fp8StreamLinearMethod(Fp8InputMethod):
    """W8A8: fp8 weights per output channel, fp8 activations per token."""

    def __init__(self) -> None:
        # Default until the weights are processed; then the device's format.
        setattr(self, FP8_INPUT_ATTR, Fp8Input(0, torch.float8_e4m3fn))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight = layer.weight.data
        fp8_dtype = fp8_dtype_for_device(weight.device)
        # Per output channel = per row of the [N, K] weight: the per-token quantiser on W.
        w_q, w_scale = quantize_reference(weight, 0, fp8_dtype)
        layer.weight = torch.nn.Parameter(w_q, requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(w_scale, requires_grad=False)
        setattr(self, FP8_INPUT_ATTR, Fp8Input(0, fp8_dtype))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor | Fp8Activation,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        q, scale, out_dtype, lead = as_codes(x, self.fp8_input)
        out = scaled_mm(q, scale, layer.weight, layer.weight_scale, out_dtype, bias)
        return out.reshape(*lead, out.shape[-1])


@register_quantization_config(QUANT_NAME)
class Fp8StreamConfig(Fp8StreamConfigBase):
    """``--quantization radiance_fp8``: on a bf16 checkpoint this config (no file is read); on a
    block-fp8 checkpoint ``from_config`` returns block.py's ``Fp8StreamBlockConfig``."""

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        """``--quantization radiance_fp8`` on a ``quant_method: fp8`` checkpoint: take it over
        (block.py), or refuse it here, naming the field, if it is not 128x128 block-fp8 with
        dynamic activations. Without the flag, and for other formats, vLLM decides as stock."""
        if user_quant != QUANT_NAME or hf_quant_cfg.get("quant_method") != "fp8":
            return None
        problem = checkpoint_problem(hf_quant_cfg)
        if problem:
            raise ValueError(f"--quantization {QUANT_NAME} cannot serve this fp8 checkpoint: {problem}")
        return QUANT_NAME

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8StreamConfig:
        if config.get("quant_method") == "fp8":  # the checkpoint's quantization_config
            return Fp8StreamBlockConfig.from_checkpoint(config)
        return cls()

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            if skipped(prefix):
                return UnquantizedLinearMethod()
            return Fp8StreamLinearMethod()
        return None  # embeddings, lm_head, routed experts, attention: stock


def register() -> str:
    """Importing this module registered the config; the plugin calls this for the log line."""
    return QUANT_NAME
