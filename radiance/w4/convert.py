"""Turning a loaded vLLM layer into a 4-bit one, shared by the w4-drafter and int4-head patches.

A converted layer keeps its module (same name, same place in the model) and gets:

* ``w4_qweight`` / ``w4_scales``: non-persistent buffers in the layout of ``radiance.kernels.w4_layout``;
* ``weight`` replaced by an empty tensor of the original dtype (the memory is freed before
  vLLM profiles the KV cache, and code that only reads ``layer.weight.dtype`` still works);
* ``quant_method`` replaced by a method whose ``apply`` runs ``torch.ops.radiance.w4a16_gemm``
  (Triton on GPU, the reference on CPU); everything else is delegated to the original method.

Fail closed: nothing on the layer changes until the packed weight exists, and the first
conversion on a device runs the GEMM once against the reference (``kernel_self_check``); if
that fails, nothing is converted and vLLM keeps its own path. ``apply`` itself is straight-line
code (no try/except): it runs inside vLLM's ``torch.compile``d graph, where a graph break is
an error.
"""
from __future__ import annotations

import logging

import torch

from ..kernels import w4a16_gemm as wk
from ..kernels import w4_layout as layout
from . import quant

logger = logging.getLogger("radiance")


def dequant_block_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                      dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A block-fp8 checkpoint weight ``[N, K]`` and its ``[ceil(N/bn), ceil(K/bk)]`` scales
    back to ``dtype`` (the block is the file's, not our group)."""
    n, k = weight.shape
    bn, bk = block
    s = scale_inv.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (weight.float() * s).to(dtype)


class W4Method:
    """Quant method of a converted layer: the 4-bit GEMM in ``apply``, the rest delegated."""

    # Takes a bf16 tensor only: it must not pass on the fp8-input declaration of the method it
    # replaced (fp8-stream's plan reads ``quant_method.radiance_fp8_input``).
    radiance_fp8_input = None

    def __init__(self, inner, group_size: int) -> None:
        self._inner = inner
        self.group_size = group_size

    def __getattr__(self, name):
        inner = self.__dict__.get("_inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return None  # already in its runtime format

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = wk.gemm(x2, layer.w4_qweight, layer.w4_scales, self.group_size)
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if bias is None else out + bias


_CHECKED: dict[tuple[str, int | None], str | None] = {}


def kernel_self_check(device: torch.device, dtype: torch.dtype, group_size: int) -> str | None:
    """Run the op once on ``device`` against the reference; None if it agrees, else why not.
    Cached per device: a conversion never starts on a device whose kernel is broken."""
    key = (f"{device.type}:{dtype}:{group_size}", device.index)
    if key in _CHECKED:
        return _CHECKED[key]
    problem = None
    try:
        gen = torch.Generator().manual_seed(0)
        k = max(256, group_size)
        w = (torch.randn((96, k), generator=gen) * 0.05).to(device)
        qw, sc = quant.quantize_pack(w, group_size, scale_dtype=dtype if dtype != torch.float32 else None)
        x = torch.randn((5, k), generator=gen).to(dtype).to(device)
        got = torch.ops.radiance.w4a16_gemm(x, qw, sc, group_size).float()
        want = wk.w4a16_gemm_reference(x, qw, sc, group_size).float()
        err = float((got - want).abs().max())
        if not err <= 2e-2 * max(1.0, float(want.abs().max())):
            problem = f"4-bit GEMM self-check on {device} differs from the reference by {err:.3g}"
    except Exception as exc:
        problem = f"4-bit GEMM self-check on {device} raised {type(exc).__name__}: {exc}"
    _CHECKED[key] = problem
    return problem


def install_packed(layer: torch.nn.Module, method, qweight: torch.Tensor, scales: torch.Tensor,
                   group_size: int, method_cls=W4Method, keep_weight: bool = False, **method_kw) -> None:
    """Swap a layer over to its packed weight (the only step that mutates the layer). ``keep_weight``:
    the loaded weight stays too, for a method that still sends some calls to it."""
    old = layer.weight
    layer.register_buffer("w4_qweight", qweight, persistent=False)
    layer.register_buffer("w4_scales", scales, persistent=False)
    if not keep_weight:
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=old.dtype, device=old.device), requires_grad=False)
    layer.quant_method = method_cls(method, group_size, **method_kw)
    layer._radiance_w4 = (scales.shape[1], qweight.shape[1] * layout.KBLOCK)


def quantize_weight(w: torch.Tensor, group_size: int, act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-chunked quantise + pack on the weight's device; scales in the activation dtype."""
    sdt = act_dtype if act_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    return quant.quantize_pack(w, group_size, scale_dtype=sdt)


def mib(t: torch.Tensor | int) -> float:
    n = t if isinstance(t, int) else t.numel() * t.element_size()
    return n / 2**20
