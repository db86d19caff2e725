"""What every ``radiance_fp8`` linear method and config shares: the name, which prefixes stay unquantised,
a linear's input as codes, the method that declares its fp8 input, and the config's fixed answers.

linear.py (bf16 checkpoints, the registered config) and block.py (block-fp8 checkpoints) both build on
this module and neither on the other's internals: linear's config hands a block-fp8 checkpoint to block's.
"""
from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearMethodBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

from radiance.kernels.quant_fp8 import quant_fp8

from .activation import Fp8Activation
from .plan import FP8_INPUT_ATTR, Fp8Input

QUANT_NAME = "radiance_fp8"
# Prefix suffixes that stay in the checkpoint dtype.
SKIPPED_SUFFIXES = (".gate", ".shared_expert_gate", "lm_head")
# A VL wrapper's vision tower (Qwen3.5's ``visual.*``): not part of the decoder the stream feeds,
# and its activations are not what the per-token quantiser was chosen for.
SKIPPED_TREES = ("visual",)


def skipped(prefix: str) -> bool:
    return prefix.endswith(SKIPPED_SUFFIXES) or any(part in SKIPPED_TREES for part in prefix.split("."))


def as_codes(x: torch.Tensor | Fp8Activation, spec: Fp8Input):
    """A linear's input as (codes [M, K], scales, out dtype, leading dims): an epilogue's
    ``Fp8Activation`` as it is (it must be in the format the linear declared), a tensor quantised
    here with the epilogue's own quantiser in the declared format."""
    if isinstance(x, Fp8Activation):
        if x.q.dtype != spec.fp8_dtype:
            raise ValueError(f"Fp8Activation in {x.q.dtype}, this linear takes {spec.fp8_dtype}")
        return x.q.reshape(-1, x.q.shape[-1]), x.scale, x.dtype, x.q.shape[:-1]
    q, scale = quant_fp8(x.reshape(-1, x.shape[-1]), spec.group_size, spec.fp8_dtype)
    return q, scale, x.dtype, x.shape[:-1]


class Fp8InputMethod(LinearMethodBase):
    """A linear method that declares the pre-quantised input it takes (``radiance_fp8_input``,
    read by plan.py). Its weight is created as the checkpoint stores a bf16 linear, sharded and
    loaded exactly like the unquantised method; subclasses that load something else override."""

    radiance_gemm = "w8a8"  # what it runs on an Fp8Activation (the install line counts consumers by it)

    @property
    def fp8_input(self) -> Fp8Input | None:
        return getattr(self, FP8_INPUT_ATTR)

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        UnquantizedLinearMethod.create_weights(self, layer, input_size_per_partition,
                                               output_partition_sizes, input_size, output_size,
                                               params_dtype, **extra_weight_attrs)


class Fp8StreamConfigBase(QuantizationConfig):
    """The answers every radiance_fp8 config gives alike (the bf16 one in linear.py, the block-fp8 one in
    block.py, and radiance_w4's on top of them)."""

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
