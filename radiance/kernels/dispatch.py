"""Which implementation of an op runs: Triton on a GPU tensor, the PyTorch reference elsewhere."""
from __future__ import annotations

import functools
import re

import torch


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def use_triton(*tensors: torch.Tensor) -> bool:
    """True when every tensor lives on a CUDA/ROCm device and Triton imports."""
    return bool(tensors) and all(t.is_cuda for t in tensors) and triton_available()


def fp8_dtype_for_device(device: torch.device | None = None) -> torch.dtype:
    """float8_e4m3fnuz on gfx94x (MI300), float8_e4m3fn everywhere else (gfx12, sm_89+, CPU)."""
    if device is not None and device.type == "cuda" and torch.version.hip:
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def device_key(device: torch.device) -> str:
    """File stem of a device's config table: 'nvidia_h200', 'gfx1201', ..."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return re.sub(r"[^a-z0-9]+", "_", props.name.lower()).strip("_")
