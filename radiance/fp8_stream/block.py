"""``radiance_fp8`` on a block-fp8 checkpoint (the DeepSeek / Qwen FP8 format).

Such a checkpoint stores a converted linear as float8_e4m3fn ``weight [N, K]`` plus
``weight_scale_inv [ceil(N/128), ceil(K/128)]`` (each 128x128 block's dequant multiplier) and
says ``quantization_config: {quant_method: fp8, activation_scheme: dynamic,
weight_block_size: [128, 128], modules_to_not_convert | ignored_layers: [...]}``. vLLM's own
Fp8LinearMethod quantises the activation per token-group of 128 inside ``apply``; here
``--quantization radiance_fp8`` takes the checkpoint over (linear.py's
``override_quantization_method`` / ``from_config`` hand it to ``Fp8StreamBlockConfig``), and
every decoder linear gets one of:

  * ``BlockFp8StreamLinearMethod`` -- a converted linear. The weight and its inverse block
    scales are created, sharded and loaded exactly as vLLM's Fp8LinearMethod does (its
    parameter helpers, ``validate_fp8_block_shape``, weight_loader_v2 with block-scale shard
    offsets) and kept as loaded, ``[N, K]`` + block scales, no re-layout. ``apply`` takes a
    tensor (quantised per token-group of 128 with ``quant_fp8``, the quantiser of the
    add_rms_quant epilogue in its group mode) or an ``Fp8Activation`` with group-128 scales;
    GEMM ``fp8_gemm`` group x block. Declares ``Fp8Input(128, fp8 dtype)``.
  * ``KeptLinearMethod`` -- a linear the checkpoint leaves in bf16 that reads a streamed site
    (``CONSUMER_SUFFIXES``: e.g. the GDN's in_proj_ba, whose N is no multiple of 128 and which
    the published Qwen3-Next FP8 checkpoints keep; a full-attention q/k/v that could not be
    blocked). Its bf16 weight stays exactly as stored; its input is the group-128 fp8
    activation, dequantised (``q * scale``, rounded to the activation dtype) before a bf16
    GEMM -- given a tensor it quantises and dequantises it the same way, so the stock path and
    the contract compute the same thing. Declares ``Fp8Input(128, fp8 dtype)``, so a GDN or
    attention site whose other consumer is converted still streams. (Quantising the weight
    online in 128x128 blocks would work too -- fp8_gemm takes a partial last N block -- but it
    would add weight rounding the checkpoint's authors chose to avoid; here only the
    activation, which the contract must hand over in fp8 anyway, is rounded.) With K not a
    multiple of 128 it declares nothing and runs as plain bf16.
  * ``UnquantizedLinearMethod`` -- every other linear the checkpoint leaves unconverted
    (router and shared-expert gates, lm_head-side modules): stock.
Non-linear layers (routed experts, attention KV-cache scales) get exactly what vLLM's
``Fp8Config`` would give them for this checkpoint, so experts load as the file stores them.

fp8 format of the device: the checkpoint is e4m3fn; on gfx94x (``fp8_dtype_for_device`` ->
e4m3fnuz) the weights follow vLLM's own rule, ``normalize_e4m3fn_to_e4m3fnuz``: the bit
pattern 0x80 (-0 in fn, NaN in fnuz) becomes 0, the bits are reinterpreted as fnuz (half the
fn value) and the block scales doubled -- exact, no re-rounding; the activations are then
quantised to fnuz (FP8_MAX 224) by the epilogue and by ``apply``. Any other device format is
refused at load. A checkpoint this mode cannot serve (static activations, other block sizes,
an fp8 ``fmt`` other than e4m3) is refused when vLLM resolves ``--quantization`` (one
ValueError naming the field), before anything is loaded.

Limitation: the GEMM and the group quantiser need whole 128-groups along K, so a converted
linear with ``K % 128 != 0`` per shard is refused at create_weights (vLLM's
``validate_fp8_block_shape`` already requires it of row-parallel shards).
"""
from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.linear import (
    LinearBase,
    UnquantizedLinearMethod,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.quantization.fp8 import Fp8Config
from vllm.model_executor.layers.quantization.utils.fp8_utils import (
    create_fp8_scale_parameter,
    create_fp8_weight_parameter,
    validate_fp8_block_shape,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped
from vllm.model_executor.layers.quantization.utils.w8a8_utils import (
    normalize_e4m3fn_to_e4m3fnuz,
)
from vllm.model_executor.parameter import BlockQuantScaleParameter

from radiance.kernels.dispatch import fp8_dtype_for_device
from radiance.kernels.fp8_gemm import scaled_mm

from .activation import Fp8Activation
from .base import Fp8InputMethod, Fp8StreamConfigBase, as_codes
from .plan import FP8_INPUT_ATTR, Fp8Input

GROUP = 128
BLOCK = [GROUP, GROUP]
CHECKPOINT_FP8 = torch.float8_e4m3fn
# Linears that read a site's normed activation (plan.py: attention_consumers / mlp_consumers).
CONSUMER_SUFFIXES = (".self_attn.qkv_proj", ".linear_attn.in_proj_qkvz", ".linear_attn.in_proj_ba",
                     ".mlp.gate_up_proj")


def checkpoint_problem(cfg: dict[str, Any]) -> str | None:
    """Why radiance_fp8 cannot serve this ``quant_method: fp8`` checkpoint (None: it can)."""
    scheme = cfg.get("activation_scheme")
    if scheme != "dynamic":
        return f"activation_scheme {scheme!r}: only dynamic activations are quantised here"
    block = cfg.get("weight_block_size")
    if block is None:
        return "no weight_block_size: per-tensor fp8 checkpoints are not taken, only 128x128 blocks"
    if list(block) != BLOCK:
        return (f"weight_block_size {list(block)}: the epilogue quantises per group of {GROUP} and "
                f"fp8_gemm reads {GROUP}x{GROUP} weight blocks")
    fmt = cfg.get("fmt", "e4m3")
    if fmt != "e4m3":
        return f"fmt {fmt!r}: only e4m3 weights"
    return None


def device_fp8_dtype(device: torch.device) -> torch.dtype:
    dtype = fp8_dtype_for_device(device)
    if dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise ValueError(f"radiance_fp8: device fp8 format {dtype} cannot hold e4m3 checkpoint weights")
    return dtype


@register_weight_loader_v2_supported_method
class BlockFp8StreamLinearMethod(Fp8InputMethod):
    """W8A8: the checkpoint's 128x128-block fp8 weights, fp8 activations per group of 128."""

    # Described as vLLM's Fp8LinearMethod describes a block checkpoint (the w4-drafter reads these).
    block_quant = True
    weight_block_size = BLOCK

    def __init__(self) -> None:
        setattr(self, FP8_INPUT_ATTR, Fp8Input(GROUP, CHECKPOINT_FP8))

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        if input_size_per_partition % GROUP:
            raise ValueError(f"radiance_fp8 block mode: {getattr(layer, 'prefix', 'a linear')} has K = "
                             f"{input_size_per_partition} per shard, not a multiple of {GROUP}")
        weight_loader = extra_weight_attrs.get("weight_loader")
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = sum(output_partition_sizes)
        layer.orig_dtype = params_dtype
        # The block-scale shard offsets of the v2 weight loaders read it from the layer.
        layer.weight_block_size = BLOCK
        validate_fp8_block_shape(layer, input_size, output_size, input_size_per_partition,
                                 output_partition_sizes, BLOCK)
        layer.register_parameter("weight", create_fp8_weight_parameter(
            layer.output_size_per_partition, input_size_per_partition, weight_loader))
        layer.register_parameter("weight_scale_inv", create_fp8_scale_parameter(
            BlockQuantScaleParameter, output_partition_sizes, input_size_per_partition, BLOCK,
            weight_loader))
        setattr(self, FP8_INPUT_ATTR, Fp8Input(GROUP, device_fp8_dtype(layer.weight.device)))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight, scale_inv = layer.weight.data, layer.weight_scale_inv.data
        fp8_dtype = device_fp8_dtype(weight.device)
        if fp8_dtype == torch.float8_e4m3fnuz:
            weight, scale_inv, _ = normalize_e4m3fn_to_e4m3fnuz(weight, scale_inv)
        # Plain parameters (vLLM does the same): the loader-carrying subclasses are not needed
        # after load and Dynamo treats plain ones as constants of the module.
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layer.weight_scale_inv = torch.nn.Parameter(scale_inv.to(torch.float32), requires_grad=False)
        setattr(self, FP8_INPUT_ATTR, Fp8Input(GROUP, fp8_dtype))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor | Fp8Activation,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        q, scale, out_dtype, lead = as_codes(x, self.fp8_input)
        out = scaled_mm(q, scale, layer.weight, layer.weight_scale_inv, out_dtype, bias)
        return out.reshape(*lead, out.shape[-1])


class KeptLinearMethod(Fp8InputMethod):
    """A consumer the checkpoint keeps in bf16: exact weights, the group-128 fp8 input
    dequantised into a bf16 GEMM (see the module doc for why not online block-fp8)."""

    radiance_gemm = "bf16"

    def __init__(self) -> None:
        setattr(self, FP8_INPUT_ATTR, Fp8Input(GROUP, CHECKPOINT_FP8))

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        super().create_weights(layer, input_size_per_partition, output_partition_sizes,
                               input_size, output_size, params_dtype, **extra_weight_attrs)
        spec = None
        if input_size_per_partition % GROUP == 0:
            spec = Fp8Input(GROUP, device_fp8_dtype(layer.weight.device))
        setattr(self, FP8_INPUT_ATTR, spec)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return None  # the checkpoint's bf16 [N, K], as loaded

    def apply(self, layer: torch.nn.Module, x: torch.Tensor | Fp8Activation,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        spec = self.fp8_input
        if spec is None:
            return torch.nn.functional.linear(x, layer.weight, bias)
        q, scale, out_dtype, lead = as_codes(x, spec)
        m, k = q.shape
        a = (q.to(torch.float32).view(m, k // GROUP, GROUP) * scale.unsqueeze(-1)).view(m, k)
        out = torch.nn.functional.linear(a.to(out_dtype), layer.weight, bias)
        return out.reshape(*lead, out.shape[-1])


class Fp8StreamBlockConfig(Fp8StreamConfigBase):
    """``--quantization radiance_fp8`` on a block-fp8 checkpoint (see the module doc); linear.py's
    ``Fp8StreamConfig.from_config`` hands such a checkpoint here."""

    def __init__(self, ignored_layers: list[str] | None = None, store_dtype: str | None = None) -> None:
        super().__init__()
        self.ignored_layers = list(ignored_layers or [])
        # Read by vLLM's linears (merged shards that do not fill whole blocks) and loaders.
        self.weight_block_size = BLOCK
        self.activation_scheme = "dynamic"
        self.stock = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                               ignored_layers=self.ignored_layers, weight_block_size=BLOCK,
                               store_dtype=store_dtype)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8StreamBlockConfig:
        return cls.from_checkpoint(config)

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any]) -> Fp8StreamBlockConfig:
        problem = checkpoint_problem(config)
        if problem:
            raise ValueError(f"--quantization radiance_fp8 cannot serve this fp8 checkpoint: {problem}")
        ignored = config.get("ignored_layers") or config.get("modules_to_not_convert") or []
        return cls(ignored, config.get("store_dtype"))

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        self.ignored_layers = hf_to_vllm_mapper.apply_list(self.ignored_layers)
        self.stock.ignored_layers = list(self.ignored_layers)

    def skipped(self, prefix: str) -> bool:
        return is_layer_skipped(prefix=prefix, ignored_layers=self.ignored_layers,
                                fused_mapping=self.packed_modules_mapping, match_mode="exact")

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, LinearBase):
            if not self.skipped(prefix):
                return BlockFp8StreamLinearMethod()
            return KeptLinearMethod() if prefix.endswith(CONSUMER_SUFFIXES) else UnquantizedLinearMethod()
        # Routed experts, attention: what vLLM's Fp8Config gives this checkpoint.
        self.stock.packed_modules_mapping = self.packed_modules_mapping
        return self.stock.get_quant_method(layer, prefix)
