"""NVIDIA GPUs: NVML (``pynvml`` from nvidia-ml-py) -> ``nvidia-smi --query-gpu``.

Both number GPUs by PCI bus order. CUDA's default order is fastest-first; the two agree when
the GPUs are alike, which ``check`` warns about when they are not.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._proc import Runner, module_installed, run_command, run_library_probe
from .arch import cuda_arch, cuda_capability
from .types import GpuInfo, ProbeLog

DEFAULT_TIMEOUT = 5.0
MIB = 1024**2

# The order is the CSV's column order; compute_cap needs a driver from 2021 on (R510), so the
# probe retries without it when the driver rejects the field.
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.free",
    "driver_version",
    "pci.bus_id",
    "compute_cap",
)
_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"}


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.strip()
    return None if v.lower() in _MISSING else v


def _int(value: str | None) -> int | None:
    v = _clean(value)
    try:
        return int(float(v)) if v is not None else None
    except ValueError:
        return None


def normalize_bus_id(bus_id: str | None) -> str | None:
    """NVIDIA prints an 8-digit PCI domain ("00000000:18:00.0"); sysfs and AMD use 4."""
    if not bus_id:
        return None
    b = bus_id.strip().lower()
    domain, sep, rest = b.partition(":")
    if sep and len(domain) > 4 and set(domain[:-4]) <= {"0"}:
        b = f"{domain[-4:]}:{rest}"
    return b


def parse_nvidia_smi_csv(text: str, fields: Sequence[str] = SMI_FIELDS) -> list[GpuInfo]:
    """Output of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` -> GpuInfo.

    Memory columns are MiB (``nounits``); values a GPU cannot report come as "[N/A]".
    """
    gpus: list[GpuInfo] = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(fields):
            continue  # a warning line, or a driver that printed fewer columns
        rec = dict(zip(fields, (c.strip() for c in row), strict=True))
        index = _int(rec.get("index"))
        cc = cuda_capability(_clean(rec.get("compute_cap")) or "")
        total = _int(rec.get("memory.total"))
        free = _int(rec.get("memory.free"))
        gpus.append(
            GpuInfo(
                vendor="nvidia",
                index=index if index is not None else len(gpus),
                name=_clean(rec.get("name")) or "NVIDIA GPU",
                arch=cuda_arch(*cc) if cc else "unknown",
                memory_total_bytes=(total or 0) * MIB,
                memory_free_bytes=free * MIB if free is not None else None,
                driver=_clean(rec.get("driver_version")),
                uuid=_clean(rec.get("uuid")),
                pci_bus_id=normalize_bus_id(_clean(rec.get("pci.bus_id"))),
                source="nvidia-smi",
            )
        )
    gpus.sort(key=lambda g: g.index)
    return gpus


# Runs in a child interpreter: nvmlInit() blocks for as long as a hung driver does.
_NVML_SCRIPT = r"""
import json, sys
try:
    import pynvml as n
except Exception as e:
    print(json.dumps({"error": "import pynvml: %s" % e})); sys.exit(0)
def s(v):
    return v.decode() if isinstance(v, bytes) else v
try:
    n.nvmlInit()
except Exception as e:
    print(json.dumps({"error": "nvmlInit: %s" % e})); sys.exit(0)
out = {"gpus": []}
try:
    try:
        out["driver"] = s(n.nvmlSystemGetDriverVersion())
    except Exception:
        pass
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        rec = {"index": i, "errors": []}
        def grab(key, fn):
            try:
                rec[key] = fn()
            except Exception as e:
                rec["errors"].append("%s: %s" % (key, e))
        grab("name", lambda: s(n.nvmlDeviceGetName(h)))
        grab("uuid", lambda: s(n.nvmlDeviceGetUUID(h)))
        grab("memory", lambda: (lambda m: [m.total, m.free])(n.nvmlDeviceGetMemoryInfo(h)))
        grab("pci_bus_id", lambda: s(n.nvmlDeviceGetPciInfo(h).busId))
        grab("cc", lambda: list(n.nvmlDeviceGetCudaComputeCapability(h)))
        out["gpus"].append(rec)
finally:
    try:
        n.nvmlShutdown()
    except Exception:
        pass
print(json.dumps(out, default=str))
"""


def parse_nvml_records(data: dict[str, Any]) -> list[GpuInfo]:
    """What ``_NVML_SCRIPT`` printed -> GpuInfo."""
    gpus: list[GpuInfo] = []
    driver = data.get("driver")
    for rec in data.get("gpus", []):
        mem = rec.get("memory") or [0, None]
        cc = rec.get("cc")
        gpus.append(
            GpuInfo(
                vendor="nvidia",
                index=int(rec.get("index", len(gpus))),
                name=str(rec.get("name") or "NVIDIA GPU"),
                arch=cuda_arch(int(cc[0]), int(cc[1])) if cc and len(cc) == 2 else "unknown",
                memory_total_bytes=int(mem[0] or 0),
                memory_free_bytes=int(mem[1]) if mem[1] is not None else None,
                driver=str(driver) if driver else None,
                uuid=rec.get("uuid"),
                pci_bus_id=normalize_bus_id(rec.get("pci_bus_id")),
                source="nvml",
            )
        )
    gpus.sort(key=lambda g: g.index)
    return gpus


def probe(
    root: Path = Path("/"),
    timeout: float = DEFAULT_TIMEOUT,
    *,
    runner: Runner | None = None,
    use_library: bool | None = None,
    log: ProbeLog | None = None,
) -> list[GpuInfo]:
    """NVIDIA GPUs. Never raises; what each step did goes to ``log``.

    As for AMD, a ``root`` other than "/" is a captured tree: NVML is not consulted unless
    ``use_library`` says so, and nvidia-smi runs only through an explicit ``runner``.
    """
    log = log if log is not None else ProbeLog()
    live = root == Path("/")
    if use_library is None:
        use_library = live
    if runner is None and live:
        runner = run_command
    # /dev/dxg is WSL2's GPU bridge, where /proc/driver/nvidia does not exist.
    signals = ("proc/driver/nvidia/version", "dev/nvidiactl", "dev/dxg")
    if not any((root / s).exists() for s in signals):
        why = "no NVIDIA driver (no /proc/driver/nvidia, /dev/nvidiactl or /dev/dxg)"
        for name in ("nvidia.nvml", "nvidia.nvidia-smi"):
            log.record(name, "unavailable", why)
        return []

    found: list[GpuInfo] = []
    if not use_library:
        log.record("nvidia.nvml", "skipped", "not the live system" if not live else "disabled")
    elif not module_installed("pynvml"):
        log.record("nvidia.nvml", "unavailable", "python module pynvml (nvidia-ml-py) not installed")
    else:
        found = _probe_nvml(timeout, run_command, log)

    if found:
        log.record("nvidia.nvidia-smi", "skipped", "an earlier probe answered")
    elif runner is None:
        log.record("nvidia.nvidia-smi", "skipped", "not the live system")
    else:
        found = _probe_smi(timeout, runner, log)

    mine = [o for o in log.outcomes if o.name.startswith("nvidia.")]
    driver_loaded = (root / "proc/driver/nvidia/version").exists() or (root / "dev/nvidiactl").exists()
    quiet = all(o.status in ("unavailable", "skipped") for o in mine)
    if not found and driver_loaded and quiet and runner is not None:
        log.warnings.append(
            "the NVIDIA driver is loaded (/proc/driver/nvidia) but neither NVML nor nvidia-smi "
            "is installed to list the GPUs; install nvidia-ml-py or the driver utilities"
        )
    return found


def _probe_nvml(timeout: float, runner: Runner, log: ProbeLog) -> list[GpuInfo]:
    data = run_library_probe("nvidia.nvml", _NVML_SCRIPT, timeout, runner, log)
    if data is None:
        return []
    if "error" in data:
        # No driver behind the bindings: the normal state of a machine with pynvml but no GPU.
        no_driver = ("NVML Shared Library Not Found", "Driver Not Loaded")
        status = "unavailable" if any(m in data["error"] for m in no_driver) else "failed"
        log.record("nvidia.nvml", status, str(data["error"]))
        return []
    gpus = parse_nvml_records(data)
    log.record("nvidia.nvml", "ok" if gpus else "empty", f"{len(gpus)} GPU(s)", len(gpus))
    return gpus


def _smi_argv(fields: Sequence[str]) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def _probe_smi(timeout: float, runner: Runner, log: ProbeLog) -> list[GpuInfo]:
    fields: Sequence[str] = SMI_FIELDS
    res = runner(_smi_argv(fields), timeout)
    if res.failure is None and res.returncode != 0 and "compute_cap" in (res.stdout + res.stderr):
        fields = tuple(f for f in SMI_FIELDS if f != "compute_cap")
        res = runner(_smi_argv(fields), timeout)
    if res.failure == "not_found":
        log.record("nvidia.nvidia-smi", "unavailable", "nvidia-smi not installed")
        return []
    if not res.ok:
        log.record("nvidia.nvidia-smi", "timeout" if res.failure == "timeout" else "failed", res.describe())
        return []
    gpus = parse_nvidia_smi_csv(res.stdout, fields)
    detail = f"{len(gpus)} GPU(s)" + ("" if "compute_cap" in fields else "; driver too old for compute_cap")
    log.record("nvidia.nvidia-smi", "ok" if gpus else "empty", detail, len(gpus))
    return gpus
