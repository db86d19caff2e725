"""The pre-quantised activation that flows from an epilogue into its consumers.

``Fp8Activation(q, scale, dtype)``: fp8 codes ``q [M, K]``, fp32 scales (``[M, 1]`` per token
or ``[M, K/128]`` per group) and the *unquantised* dtype the stock activation would have had.
It passes through vLLM's stock module code unchanged: ``ColumnParallelLinear.forward`` (and
its Merged / QKV subclasses) hands ``input_`` straight to ``quant_method.apply``, and
Qwen3-Next's GDN forward only asks its input for ``.size(0)``, ``.dtype`` and ``.device``
before feeding it to ``in_proj_qkvz`` / ``in_proj_ba``. The few tensor attributes here answer
those questions as the bf16 activation would, so that code runs as is.

A NamedTuple rather than a tensor subclass: Dynamo traces NamedTuples and their properties
natively, and the custom ops on either side keep taking and returning plain tensors.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Fp8Activation(NamedTuple):
    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype  # what the stock (unquantised) activation would be

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def ndim(self) -> int:
        return self.q.dim()

    def dim(self) -> int:
        return self.q.dim()

    def size(self, dim: int | None = None):
        return self.q.size() if dim is None else self.q.size(dim)
