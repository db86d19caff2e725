"""Which implementation of an op runs: Triton on a GPU tensor, the PyTorch reference elsewhere;
and the small description of a device that every launcher's choices are made from."""
from __future__ import annotations

import contextlib
import functools
import os
import re
import sys

import torch

from .device import DeviceInfo


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


# Triton decides at import whether kernels are interpreted, so the flag is fixed per process.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
_DESCRIBED: dict[torch.device, DeviceInfo] = {}
_OVERRIDE: list[DeviceInfo] = []
# Caches of launch plans keyed by torch device; emptied when the description of a device changes
# (``describing``), so a plan is never one made for another description.
_PLAN_CACHES: list[dict] = []


def plan_cache() -> dict:
    """A dict for a launcher's plans, emptied whenever ``describing`` swaps the description."""
    cache: dict = {}
    _PLAN_CACHES.append(cache)
    return cache


def _clear_plan_caches() -> None:
    for cache in _PLAN_CACHES:
        cache.clear()


def describe(device: torch.device) -> DeviceInfo:
    """The DeviceInfo of ``device`` (or the one ``describing`` set)."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    info = _DESCRIBED.get(device)
    if info is None:
        info = _DESCRIBED[device] = _describe(device, INTERPRET)
    return info


def _describe(device: torch.device, interpret: bool) -> DeviceInfo:
    if device.type != "cuda":
        return DeviceInfo("cpu", "cpu", 0, device.type, interpret)
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        arch = props.gcnArchName.split(":")[0]
        return DeviceInfo("hip", arch, props.multi_processor_count, arch, interpret)
    return DeviceInfo("cuda", f"sm{props.major}{props.minor}", props.multi_processor_count,
                      _name_key(props.name), interpret)


@contextlib.contextmanager
def describing(info: DeviceInfo):
    """Every device is ``info`` inside the block: the AOT list and its tests plan launches for a
    target GPU with CPU tensors."""
    _OVERRIDE.append(info)
    _clear_plan_caches()
    try:
        yield info
    finally:
        _OVERRIDE.pop()
        _clear_plan_caches()


_VLLM_FP8: list = []  # vLLM's (format, bound), once asked


def vllm_fp8() -> tuple[torch.dtype, float] | None:
    """(fp8 format, its bound) vLLM quantises to on this process's platform -- its
    ``current_platform.fp8_dtype()`` and ``get_fp8_min_max()`` -- or None where vLLM has not been
    imported: the kernels never import vLLM themselves (their tests, benchmarks and the AOT build
    run without it); inside the engine vLLM is loaded long before a kernel is planned."""
    if not _VLLM_FP8:
        if "vllm" not in sys.modules:
            return None
        try:
            from vllm.model_executor.layers.quantization.utils.quant_utils import get_fp8_min_max
            from vllm.platforms import current_platform

            _VLLM_FP8.append((current_platform.fp8_dtype(), float(get_fp8_min_max()[1])))
        except Exception:  # noqa: BLE001 - a vLLM without these answers: the plain-torch facts
            _VLLM_FP8.append(None)
    return _VLLM_FP8[0]


def fp8_dtype_for_device(device: torch.device | None = None) -> torch.dtype:
    """The fp8 format ``device`` quantises to: vLLM's on a GPU where vLLM runs, so a patch and the
    stock layers beside it agree; elsewhere (kernels without vLLM, a target described for the AOT
    list) the device description's: float8_e4m3fnuz on gfx94x (MI300), float8_e4m3fn everywhere
    else (gfx12, sm_89+, CPU)."""
    v = vllm_fp8()
    if v is not None and not _OVERRIDE and (device is None or device.type == "cuda"):
        return v[0]
    if device is None:
        return torch.float8_e4m3fn
    return describe(device).fp8_dtype


def _name_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def device_key(device: torch.device) -> str:
    """File stem of a device's config table: 'nvidia_h200', 'gfx1201', ..."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    if torch.version.hip:
        return props.gcnArchName.split(":")[0]
    return _name_key(props.name)


# Libraries must live as long as the process; the ops registered through them die with them.
_LIBRARIES: list = []


def register_library_op(name: str, cpu_impl, gpu_impl, fake):
    """Register ``torch.ops.radiance.<name>``: the one way every kernel becomes an op. Returns the
    default overload, which the kernel's public entry calls.

    What an op must do here: be traceable where vLLM runs it -- opaque to torch.compile, which
    traces it through ``fake`` (output shapes and dtypes, no data), and recorded by CUDA graphs,
    whose capture replays its launches -- so each op has a schema and a fake; work on CPU tensors
    with the PyTorch reference (``cpu_impl``: the kernels' tests, the CPU engine), and on CUDA /
    ROCm tensors with the Triton path (``gpu_impl``). ``torch.library.Library`` (define, one impl
    per dispatch key, the fake) gives exactly that, as vLLM's ``direct_register_custom_op`` does.
    ``torch.library.custom_op`` would too, but wraps every eager call in Python autograd and
    output-aliasing checks: about 20 us per call on the host (docs/benchmarks.md), for ops that run
    per layer or per draft slot. The schema is inferred from ``cpu_impl``'s annotations (no input
    is mutated); ``torch.library.opcheck`` passes on ops made here."""
    lib = torch.library.Library("radiance", "FRAGMENT")  # noqa: TOR901 - kept in _LIBRARIES
    lib.define(name + torch.library.infer_schema(cpu_impl, mutates_args=()))
    lib.impl(name, gpu_impl, "CUDA")
    lib.impl(name, cpu_impl, "CPU")
    torch.library.register_fake(f"radiance::{name}", fake, lib=lib)
    _LIBRARIES.append(lib)
    return getattr(torch.ops.radiance, name).default
