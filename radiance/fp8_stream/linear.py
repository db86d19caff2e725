"""``radiance_fp8``: online W8A8 fp8 for bf16 checkpoints, with linears that take (q, scale).

vLLM's own fp8 methods quantise their input inside ``apply``, so an fp8-stream epilogue has
nobody to hand its ``(q, scale)`` to. This out-of-tree quantization config (registered with
vLLM's ``register_quantization_config`` as ``QUANT_NAME`` by the plugin, in every process)
gives every decoder linear a method that takes either:

  * a plain tensor -- quantised per token here with ``quantize_reference``, the quant half of
    ``add_rms_quant`` (vLLM's QuantFP8 arithmetic). With fp8-stream off this IS the "stock
    fp8 path" the contract is compared against;
  * an ``Fp8Activation`` from an epilogue -- used as is, no second quantisation.

Weights are quantised at ``process_weights_after_loading`` (after the TP shard was loaded,
so each rank's rows get their own scales): per output channel, fp8 format of the device
(``fp8_dtype_for_device``). The GEMM is ``torch.ops.radiance.fp8_gemm`` (``_scaled_mm`` /
Triton on a GPU, the reference on CPU). The method declares
``radiance_fp8_input = Fp8Input(0, fp8 dtype)``: plan.py reads it to decide which sites may
stream.

Left unquantised (``UnquantizedLinearMethod`` or None, as vLLM's configs do): the MoE router
gate and the shared-expert gate (tiny, and they feed a softmax/sigmoid), lm_head and the
embeddings (not LinearBase here), the routed experts (FusedMoE keeps its stock method, so
sparse-MoE sites decline in the plan), attention KV caches.
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from radiance.kernels.add_rms_quant import quantize_reference
from radiance.kernels.dispatch import fp8_dtype_for_device
from radiance.kernels.fp8_gemm import scaled_mm

from .activation import Fp8Activation
from .plan import FP8_INPUT_ATTR, Fp8Input

QUANT_NAME = "radiance_fp8"
# Prefix suffixes that stay in the checkpoint dtype.
SKIPPED_SUFFIXES = (".gate", ".shared_expert_gate", "lm_head")


def skipped(prefix: str) -> bool:
    return prefix.endswith(SKIPPED_SUFFIXES)


class Fp8StreamLinearMethod(LinearMethodBase):
    """W8A8: fp8 weights per output channel, fp8 activations per token."""

    def __init__(self) -> None:
        # Default until the weights are processed; then the device's format.
        setattr(self, FP8_INPUT_ATTR, Fp8Input(0, torch.float8_e4m3fn))

    @property
    def fp8_input(self) -> Fp8Input:
        return getattr(self, FP8_INPUT_ATTR)

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        # The checkpoint's bf16 weight, sharded and loaded exactly like the unquantised method.
        UnquantizedLinearMethod.create_weights(self, layer, input_size_per_partition,
                                               output_partition_sizes, input_size, output_size,
                                               params_dtype, **extra_weight_attrs)

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
        if isinstance(x, Fp8Activation):
            q, scale, out_dtype = x.q, x.scale, x.dtype
            lead = q.shape[:-1]
        else:
            lead = x.shape[:-1]
            q, scale = quantize_reference(x.reshape(-1, x.shape[-1]), 0, self.fp8_input.fp8_dtype)
            out_dtype = x.dtype
        out = scaled_mm(q.reshape(-1, q.shape[-1]), scale, layer.weight, layer.weight_scale,
                        out_dtype, bias)
        return out.reshape(*lead, out.shape[-1])


@register_quantization_config(QUANT_NAME)
class Fp8StreamConfig(QuantizationConfig):
    """``--quantization radiance_fp8`` on a bf16 checkpoint (no config file is read)."""

    @classmethod
    def get_name(cls) -> str:
        return QUANT_NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 89  # fp8 MMA (sm_89+); the CPU reports no capability and is not checked

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8StreamConfig:
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
