"""Hardware probe: which GPUs this machine has, and whether a profile can run on them.

    report = probe_all()                      # HardwareReport, JSON via report.to_dict()
    problems = check(report, tp=2, min_memory_gib=40, platform_wanted="auto", environ=os.environ)

One file per vendor (``amd``, ``nvidia``), each ``probe(root, timeout) -> list[GpuInfo]`` with
parsing kept apart from I/O so that tests run against captured trees under a fake ``root``.
Probing never raises: a probe that fails or times out leaves a warning in the report.
``python -m launcher.hardware --json`` prints the report (e.g. inside the target image).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import platforms
from . import amd, nvidia
from ._proc import Runner
from .arch import arch_family, fp8_dtype_for_arch, gfx_target_version_to_arch, normalize_arch
from .host import probe_host
from .types import GIB, DeviceNode, GpuInfo, HardwareReport, HostInfo, Platform, ProbeLog, ProbeOutcome
from .visibility import resolve

__all__ = [
    "HardwareVerdict",
    "DeviceNode",
    "GpuInfo",
    "HardwareReport",
    "HostInfo",
    "ProbeOutcome",
    "arch_family",
    "check",
    "engine_arch",
    "evaluate",
    "fp8_dtype_for_arch",
    "gfx_target_version_to_arch",
    "normalize_arch",
    "probe_all",
]

PlatformWanted = str  # one of launcher.platforms.WANTED
_VENDOR = {p.name: p.probe for p in platforms.PLATFORMS.values() if p.gpu}
_VENDOR_NAME = {p.probe: p.vendor_name for p in platforms.PLATFORMS.values() if p.gpu}


def probe_all(
    root: Path = Path("/"),
    timeout: float = 5.0,
    *,
    runner: Runner | None = None,
    use_library: bool | None = None,
    access: Callable[[Path, int], bool] = os.access,
    user_groups: Sequence[str] | None = None,
) -> HardwareReport:
    """Probe AMD then NVIDIA GPUs and the host under ``root``; never raises.

    ``timeout`` bounds each external command (amdsmi/NVML run in a child interpreter too).
    The keyword arguments exist for captured trees in tests: ``runner`` replays the output of
    ``rocminfo``/``nvidia-smi``, ``use_library`` forces the amdsmi/NVML step on or off,
    ``access`` stands in for ``os.access`` (a test running as root can open anything),
    ``user_groups`` for the groups of the current user.
    """
    root = Path(root)
    log = ProbeLog()
    gpus: list[GpuInfo] = []
    for vendor in (amd, nvidia):
        try:
            gpus += vendor.probe(root, timeout, runner=runner, use_library=use_library, log=log)
        except Exception as exc:  # a parser bug must not take `radiance check` down
            log.warnings.append(f"{vendor.__name__.rsplit('.', 1)[-1]} probe crashed: {type(exc).__name__}: {exc}")
    amd_gpus = [g for g in gpus if g.vendor == "amd"]
    nv_gpus = [g for g in gpus if g.vendor == "nvidia"]
    if amd_gpus and nv_gpus:
        chosen = platforms.for_probe("amd" if len(amd_gpus) >= len(nv_gpus) else "nvidia").name
        log.warnings.append(
            f"both AMD ({len(amd_gpus)}) and NVIDIA ({len(nv_gpus)}) GPUs found; platform auto picks "
            f"{chosen}; set runtime.platform in the profile to choose"
        )
        platform: Platform = chosen  # type: ignore[assignment]
    else:
        platform = (platforms.for_probe("amd").name if amd_gpus else
                    platforms.for_probe("nvidia").name if nv_gpus else platforms.CPU.name)

    try:
        host = probe_host(root, user_groups=user_groups)
    except Exception as exc:
        host = HostInfo()
        log.warnings.append(f"host probe crashed: {type(exc).__name__}: {exc}")
    devices = amd.device_nodes(root, amd_gpus, access=access) if amd_gpus else []

    report = HardwareReport(
        platform=platform,
        gpus=gpus,
        warnings=log.warnings,
        probes=log.outcomes,
        devices=devices,
        host=host,
    )
    report.problems = _device_problems(report, platform)
    return report


@dataclass
class HardwareVerdict:
    platform: Platform  # the platform the checks were made for ("auto" resolved)
    visible: list[GpuInfo] = field(default_factory=list)  # GPUs the workload will see, in its order
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {
            "platform": self.platform,
            "visible": [g.to_dict() for g in self.visible],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }


def evaluate(
    report: HardwareReport,
    *,
    tp: int = 1,
    pp: int = 1,
    min_memory_gib: float | None = None,
    platform_wanted: PlatformWanted = platforms.AUTO,
    environ: Mapping[str, str] | None = None,
) -> HardwareVerdict:
    """Everything ``check`` finds, plus warnings and the GPUs that will be used.

    ``min_memory_gib`` is per GPU (what one tensor-parallel shard needs); on the CPU platform it
    is compared with host memory.
    """
    if platform_wanted not in platforms.WANTED:
        raise ValueError(f"platform_wanted={platform_wanted!r}: expected one of {', '.join(platforms.WANTED)}")
    environ = dict(os.environ if environ is None else environ)
    platform: Platform = report.platform if platform_wanted == platforms.AUTO else platform_wanted
    result = HardwareVerdict(platform=platform, warnings=list(report.warnings))

    if platform == platforms.CPU.name:
        if platform_wanted == platforms.CPU.name and report.gpus:
            result.warnings.append(
                f"{len(report.gpus)} GPU(s) found but the profile asks for the CPU platform; they stay unused"
            )
        _check_host_memory(report.host, min_memory_gib, result)
        return result

    vendor = _VENDOR[platform]
    name = _VENDOR_NAME[vendor]
    present = report.gpus_of(vendor)  # type: ignore[arg-type]
    if not present:
        result.problems.append(
            f"the profile wants platform {platform} but no {name} GPU was found{_tried(report, vendor)}"
        )
        return result

    result.problems += _device_problems(report, platform)

    vis = resolve(vendor, present, environ)  # type: ignore[arg-type]
    result.visible = vis.visible
    result.problems += vis.problems
    result.warnings += vis.warnings

    need = max(tp, 1) * max(pp, 1)
    layout = f"tp={tp}" + (f" x pp={pp}" if pp > 1 else "")
    if len(vis.visible) < need:
        hidden = ""
        if len(vis.visible) < len(present) and vis.applied:
            hidden = f"; {len(present)} present, {' then '.join(vis.applied)} leaves {len(vis.visible)}"
        result.problems.append(
            f"{layout} needs {need} {name} GPU(s) but {len(vis.visible)} "
            f"{'is' if len(vis.visible) == 1 else 'are'} visible{hidden}"
        )

    used = vis.visible[:need]
    if len({g.arch for g in used}) > 1:
        result.warnings.append(
            "the GPUs for this parallel group differ in architecture ("
            + ", ".join(f"{g.index}: {g.arch}" for g in used)
            + "); restrict them with the visibility variable"
        )
    integrated = [g for g in used if g.integrated]
    if integrated and len(used) > len(integrated):
        result.warnings.append(
            f"{', '.join(g.label() for g in integrated)} is an integrated GPU sharing host memory; "
            f"exclude it with HIP_VISIBLE_DEVICES so the parallel group uses discrete GPUs only"
        )
    if min_memory_gib is not None:
        for g in used:
            if not g.memory_total_bytes:
                result.warnings.append(f"{g.label()}: memory size unknown (probe {g.source}); not checked")
                continue
            if g.memory_total_bytes < min_memory_gib * GIB:
                result.problems.append(
                    f"{g.label()} has {g.memory_total_gib:.1f} GiB; the profile needs "
                    f"{min_memory_gib:.1f} GiB per GPU (raise tp or lower max_model_len)"
                )
            elif g.memory_free_bytes is not None and g.memory_free_bytes < min_memory_gib * GIB:
                result.problems.append(
                    f"{g.label()} has only {g.memory_free_gib:.1f} of {g.memory_total_gib:.1f} GiB free; "
                    f"the profile needs {min_memory_gib:.1f} GiB. Other processes hold the rest "
                    f"({'amd-smi process' if vendor == 'amd' else 'nvidia-smi'} shows them)"
                )
    return result


def engine_arch(platform: str, environ: Mapping[str, str] | None = None,
                report: HardwareReport | None = None) -> str | None:
    """The arch of the first GPU of ``platform`` the engine will see here (after *_VISIBLE_DEVICES), or
    of the first present; None when this machine has none (``report``: a probe already made)."""
    if platform not in _VENDOR:
        return None
    report = probe_all() if report is None else report
    present = [g for g in report.gpus_of(_VENDOR[platform]) if g.arch and g.arch != "unknown"]  # type: ignore[arg-type]
    if not present:
        return None
    visible = resolve(_VENDOR[platform], present, dict(os.environ if environ is None else environ)).visible  # type: ignore[arg-type]
    return (visible or present)[0].arch


def check(report: HardwareReport, **layout) -> list[str]:
    """The problems that stop a profile with this layout (``evaluate``'s keywords: tp, pp,
    min_memory_gib, platform_wanted, environ) from running here; [] means go."""
    return evaluate(report, **layout).problems


def _device_problems(report: HardwareReport, platform: Platform) -> list[str]:
    """ROCm needs /dev/kfd and each GPU's render node, read-write, whatever the profile."""
    if _VENDOR.get(platform) != "amd":
        return []
    problems: list[str] = []
    kfd = report.device("/dev/kfd")
    if kfd is not None and not kfd.exists:
        problems.append(
            "/dev/kfd is missing: AMD GPUs are present but the ROCm compute interface is not. In a "
            "container pass --device /dev/kfd --device /dev/dri; on the host load the amdgpu driver"
        )
    denied = [d for d in report.devices if d.exists and not (d.readable and d.writable)]
    absent = [d for d in report.devices if d.path != "/dev/kfd" and not d.exists]
    if denied:
        groups = report.host.missing_gpu_groups
        hint = (
            f"; add the user to the {' and '.join(repr(g) for g in groups)} group"
            f"{'s' if len(groups) > 1 else ''} (sudo usermod -aG {','.join(groups)} $USER) and log in again"
            if groups
            else "; check the device permissions (ls -l /dev/kfd /dev/dri) and the user's groups"
        )
        problems.append("cannot open " + ", ".join(f"{d.path} ({_rw(d)})" for d in denied) + hint)
    if absent:
        problems.append(
            "render node(s) missing: "
            + ", ".join(d.path for d in absent)
            + "; a container needs --device /dev/dri (or those nodes) as well as /dev/kfd"
        )
    return problems


def _tried(report: HardwareReport, vendor: str) -> str:
    """Why no GPU of ``vendor`` was found: one reason when every probe gave the same, else each probe's."""
    mine = [o for o in report.probes if o.name.startswith(vendor + ".")]
    if not mine:
        return ""
    if len({(o.status, o.detail) for o in mine}) == 1:
        return f" ({mine[0].detail or mine[0].status})"
    return " [" + "; ".join(f"{o.name}: {o.status}" + (f" ({o.detail})" if o.detail else "") for o in mine) + "]"


def _rw(d: DeviceNode) -> str:
    missing = [m for m, ok in (("read", d.readable), ("write", d.writable)) if not ok]
    return "/".join(missing) + " denied"


def _check_host_memory(host: HostInfo, min_memory_gib: float | None, result: HardwareVerdict) -> None:
    if min_memory_gib is None:
        return
    if host.memory_total_bytes is None:
        result.warnings.append("host memory size unknown; not checked")
        return
    need = min_memory_gib * GIB
    if host.memory_total_bytes < need:
        result.problems.append(
            f"the host has {host.memory_total_bytes / GIB:.1f} GiB of memory; "
            f"the profile needs {min_memory_gib:.1f} GiB"
        )
    elif host.memory_available_bytes is not None and host.memory_available_bytes < need:
        result.warnings.append(
            f"only {host.memory_available_bytes / GIB:.1f} GiB of host memory is available now; "
            f"the profile needs {min_memory_gib:.1f} GiB"
        )
