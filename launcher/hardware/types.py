"""What the hardware probe reports: plain dataclasses that round-trip through JSON.

The report is produced on the host (or inside the target image, ``python -m launcher.hardware``)
and read by ``radiance check``; ``to_dict``/``from_dict`` are the wire format between the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Vendor = Literal["amd", "nvidia"]
Platform = str  # a name in launcher/platforms.py
# ok: found GPUs; empty: ran and found none; unavailable: the library/tool/sysfs is absent
# (normal on machines without that vendor); failed/timeout: present but broken (a warning);
# skipped: not run, because an earlier probe answered or the root is not the live system.
ProbeStatus = Literal["ok", "empty", "unavailable", "failed", "timeout", "skipped"]

GIB = 1024**3


@dataclass
class GpuInfo:
    vendor: Vendor
    index: int  # position in the runtime's default order (HIP / CUDA), before *_VISIBLE_DEVICES
    name: str
    arch: str  # "gfx1201", "gfx942", "gfx90a", "sm90"; "unknown" when no probe could tell
    memory_total_bytes: int
    memory_free_bytes: int | None
    driver: str | None
    uuid: str | None = None  # "GPU-<16 hex>" on ROCm (what ROCR_VISIBLE_DEVICES accepts), "GPU-<uuid>" on CUDA
    pci_bus_id: str | None = None  # "0000:03:00.0"
    source: str = ""  # which probe found it: "amdsmi", "kfd", "rocminfo", "nvml", "nvidia-smi"
    compute_units: int | None = None  # CUs on AMD, SMs on NVIDIA where the probe knows
    kfd_node: int | None = None  # KFD topology node, for matching /dev/dri/renderD* and amdsmi
    render_minor: int | None = None  # /dev/dri/renderD<minor> the ROCm runtime opens
    integrated: bool = False  # an APU's GPU: shares host memory, rarely what a TP group wants

    @property
    def memory_total_gib(self) -> float:
        return self.memory_total_bytes / GIB

    @property
    def memory_free_gib(self) -> float | None:
        return None if self.memory_free_bytes is None else self.memory_free_bytes / GIB

    def label(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.arch})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        return cls(**_known(cls, data))


@dataclass
class ProbeOutcome:
    name: str  # "amd.amdsmi", "amd.kfd", "amd.rocminfo", "nvidia.nvml", "nvidia.nvidia-smi"
    status: ProbeStatus
    detail: str = ""
    gpus: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeOutcome:
        return cls(**_known(cls, data))


@dataclass
class DeviceNode:
    """A character device the GPU runtime must open (ROCm: /dev/kfd and /dev/dri/renderD*)."""

    path: str  # as seen by the workload, e.g. "/dev/kfd", whatever root the probe read
    exists: bool
    readable: bool
    writable: bool

    @property
    def usable(self) -> bool:
        return self.exists and self.readable and self.writable

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceNode:
        return cls(**_known(cls, data))


@dataclass
class HostInfo:
    cpu_count: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    user_groups: list[str] = field(default_factory=list)
    # Groups that grant GPU device access on this system ("render", "video") which the user
    # lacks: the hint printed when /dev/kfd or a render node cannot be opened.
    missing_gpu_groups: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostInfo:
        return cls(**_known(cls, data))


@dataclass
class HardwareReport:
    platform: Platform
    gpus: list[GpuInfo] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # block the detected platform outright
    warnings: list[str] = field(default_factory=list)
    probes: list[ProbeOutcome] = field(default_factory=list)
    devices: list[DeviceNode] = field(default_factory=list)
    host: HostInfo = field(default_factory=HostInfo)

    def gpus_of(self, vendor: Vendor) -> list[GpuInfo]:
        return [g for g in self.gpus if g.vendor == vendor]

    def device(self, path: str) -> DeviceNode | None:
        return next((d for d in self.devices if d.path == path), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "gpus": [g.to_dict() for g in self.gpus],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "probes": [p.to_dict() for p in self.probes],
            "devices": [d.to_dict() for d in self.devices],
            "host": self.host.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareReport:
        return cls(
            platform=data["platform"],
            gpus=[GpuInfo.from_dict(g) for g in data.get("gpus", [])],
            problems=list(data.get("problems", [])),
            warnings=list(data.get("warnings", [])),
            probes=[ProbeOutcome.from_dict(p) for p in data.get("probes", [])],
            devices=[DeviceNode.from_dict(d) for d in data.get("devices", [])],
            host=HostInfo.from_dict(data.get("host", {})),
        )


@dataclass
class ProbeLog:
    """Collects what each probe did; a probe never raises, it records here instead."""

    outcomes: list[ProbeOutcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def record(self, name: str, status: ProbeStatus, detail: str = "", gpus: int = 0) -> None:
        self.outcomes.append(ProbeOutcome(name, status, detail, gpus))
        if status in ("failed", "timeout"):
            self.warnings.append(f"{name} probe {status}: {detail}" if detail else f"{name} probe {status}")


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    # A report written by a newer launcher (e.g. inside an image) may carry extra keys.
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}
