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


def eager_gpu_call(*tensors: torch.Tensor) -> bool:
    """True when a call may go straight to the Triton launcher, past the dispatcher: not traced by
    torch.compile, plain tensors (fake and functional tensors must reach the registered fake /
    kernels), all on a CUDA/ROCm device, Triton importable. The dispatcher costs a few µs per
    call on the H200 host, a sizeable share of a launch for the ops that run per layer or per
    draft slot; under torch.compile and CUDA graphs the op is what is recorded."""
    return (bool(tensors) and not torch.compiler.is_compiling()
            and all(type(t) is torch.Tensor and t.is_cuda for t in tensors)
            and triton_available())


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
