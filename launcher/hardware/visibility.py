"""Which GPUs a process will see once ``ROCR_/HIP_/CUDA_VISIBLE_DEVICES`` are applied.

ROCm layers two filters: ROCR_VISIBLE_DEVICES picks among the physical GPUs (indices or
"GPU-<uuid>"), then HIP_VISIBLE_DEVICES (or CUDA_VISIBLE_DEVICES, which HIP also reads)
indexes into what ROCr left, not into the physical list. vLLM refuses to start when
HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are both set and differ, and treats an empty
value as unset. CUDA has one filter; there an empty CUDA_VISIBLE_DEVICES hides every GPU.
A list stops at its first entry that names no device (CUDA's rule, which HIP follows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .types import GpuInfo, Vendor

ROCR = "ROCR_VISIBLE_DEVICES"
HIP = "HIP_VISIBLE_DEVICES"
CUDA = "CUDA_VISIBLE_DEVICES"


@dataclass
class Visibility:
    visible: list[GpuInfo]  # in the order the runtime will number them 0, 1, ...
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # "HIP_VISIBLE_DEVICES=0,1", in application order
    rejected: list[str] = field(default_factory=list)  # entries that named no GPU


def _tokens(value: str) -> list[str]:
    return [t.strip() for t in value.split(",")]


def select(gpus: Sequence[GpuInfo], var: str, value: str) -> tuple[list[GpuInfo], list[str]]:
    """Apply one variable to ``gpus`` (the candidates, in their current numbering).

    Returns the selection and the entries that stopped it (out of range, unknown UUID,
    repeated, or a form this probe cannot resolve such as MIG instances).
    """
    chosen: list[GpuInfo] = []
    for tok in _tokens(value):
        gpu: GpuInfo | None = None
        try:
            i = int(tok)
        except ValueError:
            i = None
        if i is not None:
            gpu = gpus[i] if 0 <= i < len(gpus) else None
        elif tok:
            matches = [g for g in gpus if g.uuid and g.uuid.lower().startswith(tok.lower())]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None or any(g is gpu for g in chosen):
            return chosen, [tok]
        chosen.append(gpu)
    return chosen, []


def resolve(vendor: Vendor, gpus: Sequence[GpuInfo], environ: Mapping[str, str]) -> Visibility:
    gpus = sorted(gpus, key=lambda g: g.index)
    if vendor == "amd":
        return _resolve_rocm(gpus, environ)
    return _resolve_cuda(gpus, environ)


def _describe(gpus: Sequence[GpuInfo]) -> str:
    return ", ".join(str(g.index) for g in gpus) or "none"


def _resolve_rocm(gpus: list[GpuInfo], environ: Mapping[str, str]) -> Visibility:
    vis = Visibility(visible=list(gpus))
    rocr, hip, cuda = environ.get(ROCR), environ.get(HIP), environ.get(CUDA)
    for var, value in ((ROCR, rocr), (HIP, hip), (CUDA, cuda)):
        if value is not None and not value.strip():
            vis.warnings.append(f"{var} is set but empty; it is treated as unset (as vLLM does)")
    rocr, hip, cuda = (v if v and v.strip() else None for v in (rocr, hip, cuda))

    if hip is not None and cuda is not None and hip.replace(" ", "") != cuda.replace(" ", ""):
        vis.problems.append(
            f"{HIP}={hip} and {CUDA}={cuda} disagree; vLLM on ROCm refuses to start when both are set "
            f"and differ. Unset one of them, or give both the same value"
        )
    second_var, second = (HIP, hip) if hip is not None else (CUDA, cuda)

    if rocr is not None:
        vis.visible, bad = select(vis.visible, ROCR, rocr)
        vis.applied.append(f"{ROCR}={rocr}")
        if bad:
            vis.rejected += bad
            vis.warnings.append(
                f"{ROCR}={rocr}: entry {bad[0]!r} names none of the {len(gpus)} AMD GPU(s); "
                f"it and the entries after it are ignored"
            )
    if second is not None:
        base = vis.visible
        vis.visible, bad = select(base, second_var, second)
        vis.applied.append(f"{second_var}={second}")
        if bad:
            vis.rejected += bad
            if rocr is not None:
                vis.problems.append(
                    f"{ROCR}={rocr} and {second_var}={second} disagree: {second_var} indexes into the "
                    f"{len(base)} GPU(s) {ROCR} leaves (numbered 0..{len(base) - 1}), so entry {bad[0]!r} "
                    f"names nothing. Set only one of them, or number {second_var} from 0"
                )
            else:
                vis.warnings.append(
                    f"{second_var}={second}: entry {bad[0]!r} names none of the {len(base)} AMD GPU(s); "
                    f"it and the entries after it are ignored"
                )
        elif rocr is not None and rocr.replace(" ", "") != second.replace(" ", ""):
            vis.warnings.append(
                f"{ROCR}={rocr} and {second_var}={second} are both set: the GPUs in use are physical "
                f"{_describe(vis.visible)} ({second_var} counts within {ROCR}'s selection). Setting one "
                f"variable is clearer"
            )
    return vis


def _resolve_cuda(gpus: list[GpuInfo], environ: Mapping[str, str]) -> Visibility:
    vis = Visibility(visible=list(gpus))
    for var in (ROCR, HIP):
        if environ.get(var):
            vis.warnings.append(f"{var}={environ[var]} is set but has no effect on NVIDIA GPUs")
    cuda = environ.get(CUDA)
    if cuda is None:
        return vis
    vis.applied.append(f"{CUDA}={cuda}")
    if not cuda.strip():
        vis.visible = []
        return vis
    vis.visible, bad = select(gpus, CUDA, cuda)
    if bad:
        vis.rejected += bad
        vis.warnings.append(
            f"{CUDA}={cuda}: entry {bad[0]!r} names none of the {len(gpus)} NVIDIA GPU(s) "
            f"(MIG instances are not resolved here); it and the entries after it are ignored"
        )
    uses_indices = any(t.isdigit() for t in _tokens(cuda))
    mixed = len({g.name for g in gpus}) > 1
    if uses_indices and mixed and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        vis.warnings.append(
            f"{CUDA} uses indices on a machine with different GPU models: CUDA numbers them "
            f"fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so indices may not match nvidia-smi"
        )
    return vis
