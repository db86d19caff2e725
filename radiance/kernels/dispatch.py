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


# Libraries must live as long as the process; the ops registered through them die with them.
_LIBRARIES: list = []


def register_library_op(name: str, cpu_impl, gpu_impl, fake):
    """``torch.ops.radiance.<name>`` through ``torch.library.Library`` (CPU and CUDA impls and a
    fake), for ops on the decode path: ``torch.library.custom_op`` adds Python autograd and
    aliasing checks to every eager call (docs/architecture.md). Returns the default overload."""
    lib = torch.library.Library("radiance", "FRAGMENT")  # noqa: TOR901 - kept in _LIBRARIES
    lib.define(name + torch.library.infer_schema(cpu_impl, mutates_args=()))
    lib.impl(name, gpu_impl, "CUDA")
    lib.impl(name, cpu_impl, "CPU")
    torch.library.register_fake(f"radiance::{name}", fake, lib=lib)
    _LIBRARIES.append(lib)
    return getattr(torch.ops.radiance, name).default
