"""AMD GPUs: amdsmi (Python bindings) -> KFD sysfs topology -> ``rocminfo``.

Parsing is separate from I/O: ``parse_kfd_properties``, ``gpus_from_kfd``, ``parse_rocminfo``
and ``parse_amdsmi_records`` take text or plain data; ``probe`` does the reading. The KFD
topology is the source of truth for order and ids (it is what the ROCm runtime enumerates, so
its GPU-node order is HIP's device order); amdsmi, when it answers, adds names and free memory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._proc import CommandResult, Runner, module_installed, run_command, run_library_probe
from .arch import gfx_target_version_to_arch, normalize_arch
from .types import DeviceNode, GpuInfo, ProbeLog

KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
DEFAULT_TIMEOUT = 5.0

# KFD heap types (HSA_HEAPTYPE): 0 system, 1 frame buffer public, 2 frame buffer private.
_FB_HEAPS = (1, 2)
# KFD names GPU nodes discovered through IP discovery with this placeholder, not the ASIC.
_PLACEHOLDER_NAMES = {"", "ip discovery"}


# --------------------------------------------------------------------------- KFD sysfs


def parse_kfd_properties(text: str) -> dict[str, int]:
    """A KFD ``properties`` file ("key value" per line, all integers) -> dict."""
    props: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            props[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return props


@dataclass
class KfdNode:
    """What one ``topology/nodes/<n>`` directory holds, read but not interpreted."""

    node: int
    properties: dict[str, int]
    name: str = ""
    gpu_id: int | None = None
    mem_banks: list[dict[str, int]] = field(default_factory=list)
    # From /sys/class/drm/renderD<minor>/device (amdgpu), when present.
    vram_total: int | None = None
    vram_used: int | None = None
    product_name: str | None = None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_kfd_topology(root: Path) -> list[KfdNode] | None:
    """Every node under ``root/sys/class/kfd/kfd/topology/nodes``; None when there is no KFD.

    A node whose properties cannot be read is left out: that is how the kernel hides a GPU the
    device cgroup denies (a container started without that GPU gets EPERM).
    """
    base = root / KFD_NODES
    if not base.is_dir():
        return None
    nodes: list[KfdNode] = []
    for d in sorted((p for p in base.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        try:
            props = parse_kfd_properties((d / "properties").read_text())
        except OSError:
            continue
        node = KfdNode(
            node=int(d.name),
            properties=props,
            name=_read_text(d / "name") or "",
            gpu_id=_read_int(d / "gpu_id"),
        )
        banks = d / "mem_banks"
        if banks.is_dir():
            for b in sorted((p for p in banks.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
                try:
                    node.mem_banks.append(parse_kfd_properties((b / "properties").read_text()))
                except OSError:
                    continue
        minor = props.get("drm_render_minor")
        if minor:
            dev = root / f"sys/class/drm/renderD{minor}/device"
            node.vram_total = _read_int(dev / "mem_info_vram_total")
            node.vram_used = _read_int(dev / "mem_info_vram_used")
            node.product_name = _read_text(dev / "product_name") or None
        nodes.append(node)
    return nodes


def is_gpu_node(node: KfdNode) -> bool:
    if node.gpu_id is not None:
        return node.gpu_id != 0  # CPU nodes have gpu_id 0
    return node.properties.get("simd_count", 0) > 0 and node.properties.get("gfx_target_version", 0) > 0


def pci_bus_id(domain: int, location_id: int) -> str:
    """KFD's ``location_id`` is the PCI bus/device/function packed as bus<<8 | dev<<3 | fn."""
    bus, devfn = divmod(location_id, 256)
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7:x}"


def kfd_uuid(unique_id: int) -> str | None:
    # ROCr names an agent "GPU-" + the KFD unique_id in 16 hex digits; ROCR_VISIBLE_DEVICES takes it.
    return f"GPU-{unique_id:016x}" if unique_id else None


def gpus_from_kfd(nodes: Sequence[KfdNode], driver: str | None = None) -> list[GpuInfo]:
    """The GPU nodes, in node order, numbered as HIP numbers them (CPU nodes skipped)."""
    gpus: list[GpuInfo] = []
    for node in nodes:
        if not is_gpu_node(node):
            continue
        p = node.properties
        try:
            arch = gfx_target_version_to_arch(p.get("gfx_target_version", 0))
        except ValueError:
            arch = "unknown"
        fb = [b for b in node.mem_banks if b.get("heap_type") in _FB_HEAPS]
        total = sum(b.get("size_in_bytes", 0) for b in fb)
        if not total:
            # Old kernels report VRAM in local_mem_size; new ones print 0 there and use banks.
            total = p.get("local_mem_size", 0) or node.vram_total or 0
        free = None
        if node.vram_total is not None and node.vram_used is not None:
            free = max(node.vram_total - node.vram_used, 0)
        name = node.product_name
        if not name:
            asic = node.name if node.name.lower() not in _PLACEHOLDER_NAMES else ""
            name = f"AMD {asic}" if asic else f"AMD GPU 0x{p.get('device_id', 0):04x}"
        simd_per_cu = p.get("simd_per_cu", 0)
        gpus.append(
            GpuInfo(
                vendor="amd",
                index=len(gpus),
                name=name,
                arch=arch,
                memory_total_bytes=total,
                memory_free_bytes=free,
                driver=driver,
                uuid=kfd_uuid(p.get("unique_id", 0)),
                pci_bus_id=pci_bus_id(p.get("domain", 0), p["location_id"]) if "location_id" in p else None,
                source="kfd",
                compute_units=p["simd_count"] // simd_per_cu if simd_per_cu else None,
                kfd_node=node.node,
                render_minor=p.get("drm_render_minor") or None,
                # An APU's GPU node either carries the CPU cores itself or has no frame buffer heap.
                integrated=p.get("cpu_cores_count", 0) > 0 or (bool(node.mem_banks) and not fb),
            )
        )
    return gpus


def amdgpu_driver(root: Path) -> str | None:
    """ "amdgpu 6.10.5" for the DKMS driver (it has a version), "amdgpu" in-tree, None when not loaded."""
    mod = root / "sys/module/amdgpu"
    if not mod.is_dir():
        return None
    version = _read_text(mod / "version")
    return f"amdgpu {version}" if version else "amdgpu"


# --------------------------------------------------------------------------- rocminfo

_AGENT = re.compile(r"^Agent\s+(\d+)\s*$")
_FIELD = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9 /()_.-]*?):\s*(.*?)\s*$")
_KB = re.compile(r"^(\d+)\s*(?:\(0x[0-9a-fA-F]+\))?\s*KB", re.IGNORECASE)
_ROCK = re.compile(r"ROCk module(?: version (\S+))? is loaded")


def parse_rocminfo(text: str) -> list[GpuInfo]:
    """``rocminfo`` text -> the GPU agents, in agent order (HIP's order)."""
    m = _ROCK.search(text)
    driver = (f"amdgpu {m.group(1)}" if m.group(1) else "amdgpu") if m else None
    agents: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    pending_segment: str | None = None
    for line in text.splitlines():
        if _AGENT.match(line.strip()):
            current = {"pools": [], "isas": []}
            agents.append(current)
            pending_segment = None
            continue
        if current is None:
            continue
        fm = _FIELD.match(line)
        if not fm:
            continue
        indent, key, value = len(fm.group(1)), fm.group(2).strip(), fm.group(3)
        if indent <= 2:
            current.setdefault(key, value)  # agent level; deeper "Name:" lines belong to pools/ISAs
        elif key == "Segment":
            pending_segment = value
        elif key == "Size" and pending_segment is not None:
            km = _KB.match(value)
            if km:
                current["pools"].append((pending_segment, int(km.group(1)) * 1024))
            pending_segment = None
        elif key == "Name" and value.startswith("amdgcn-"):
            current["isas"].append(value)
    gpus: list[GpuInfo] = []
    for a in agents:
        if a.get("Device Type", "").upper() != "GPU":
            continue
        arch = normalize_arch(a["isas"][0] if a["isas"] else a.get("Name", "unknown"))
        coarse = [size for seg, size in a["pools"] if "GLOBAL" in seg and "COARSE" in seg]
        uuid = a.get("Uuid") or None
        if uuid and not re.fullmatch(r"GPU-[0-9a-fA-F]{16}", uuid):
            uuid = None  # "GPU-XX": the runtime has no unique id for this board
        bdf = _int_or_none(a.get("BDFID", ""))
        node = _int_or_none(a.get("Node", ""))
        gpus.append(
            GpuInfo(
                vendor="amd",
                index=len(gpus),
                name=a.get("Marketing Name") or a.get("Name", "AMD GPU"),
                arch=arch,
                memory_total_bytes=coarse[0] if coarse else 0,
                memory_free_bytes=None,
                driver=driver,
                uuid=uuid,
                pci_bus_id=pci_bus_id(0, bdf) if bdf is not None else None,
                source="rocminfo",
                compute_units=_int_or_none(a.get("Compute Unit", "")),
                kfd_node=node,
            )
        )
    return gpus


def _int_or_none(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- amdsmi

# Runs in a child interpreter: amdsmi_init() can block on a wedged driver, and the library keeps
# state in the process. Prints one JSON object; every call is guarded so one missing API (they
# moved between ROCm releases) costs one field, not the probe.
_AMDSMI_SCRIPT = r"""
import json, sys
try:
    import amdsmi as a
except Exception as e:
    print(json.dumps({"error": "import amdsmi: %s" % e})); sys.exit(0)
try:
    a.amdsmi_init()
except Exception as e:
    print(json.dumps({"error": "amdsmi_init: %s" % e})); sys.exit(0)
out = []
try:
    for h in a.amdsmi_get_processor_handles():
        rec = {"errors": []}
        def grab(key, name, *args):
            try:
                rec[key] = getattr(a, name)(h, *args)
            except Exception as e:
                rec["errors"].append("%s: %s" % (name, e))
        vram = getattr(getattr(a, "AmdSmiMemoryType", None), "VRAM", None)
        grab("asic", "amdsmi_get_gpu_asic_info")
        grab("vram_total", "amdsmi_get_gpu_memory_total", vram)
        grab("vram_used", "amdsmi_get_gpu_memory_usage", vram)
        grab("uuid", "amdsmi_get_gpu_device_uuid")
        grab("bdf", "amdsmi_get_gpu_device_bdf")
        grab("driver", "amdsmi_get_gpu_driver_info")
        grab("kfd", "amdsmi_get_gpu_kfd_info")
        out.append(rec)
finally:
    try:
        a.amdsmi_shut_down()
    except Exception:
        pass
print(json.dumps({"gpus": out}, default=str))
"""


def _arch_from_amdsmi(value: Any) -> str:
    # The Python bindings hand back "gfx942"; the C field is a number that has been seen both
    # as the KFD encoding (90402) and as the name's hex digits (0x942).
    if isinstance(value, str):
        v = value.strip()
        if v.lower().startswith("gfx"):
            return normalize_arch(v)
        try:
            value = int(v, 0)
        except ValueError:
            return "unknown"
    if isinstance(value, int) and value > 0:
        if value >= 10000:
            try:
                return gfx_target_version_to_arch(value)
            except ValueError:
                return "unknown"
        return f"gfx{value:x}"
    return "unknown"


def parse_amdsmi_records(records: Sequence[dict[str, Any]]) -> list[GpuInfo]:
    """What ``_AMDSMI_SCRIPT`` printed -> GpuInfo, in KFD node order where amdsmi says it."""
    gpus: list[GpuInfo] = []
    for rec in records:
        asic = rec.get("asic") or {}
        drv = rec.get("driver") or {}
        total = rec.get("vram_total")
        used = rec.get("vram_used")
        driver = None
        if drv.get("driver_name") or drv.get("driver_version"):
            driver = " ".join(str(x) for x in (drv.get("driver_name"), drv.get("driver_version")) if x)
        bdf = rec.get("bdf")
        cus = asic.get("num_compute_units")
        kfd = rec.get("kfd") or {}
        gpus.append(
            GpuInfo(
                vendor="amd",
                index=len(gpus),
                name=str(asic.get("market_name") or "AMD GPU").strip(),
                arch=_arch_from_amdsmi(asic.get("target_graphics_version")),
                memory_total_bytes=int(total) if isinstance(total, int) else 0,
                memory_free_bytes=max(int(total) - int(used), 0)
                if isinstance(total, int) and isinstance(used, int)
                else None,
                driver=driver,
                uuid=str(rec["uuid"]) if rec.get("uuid") else None,
                pci_bus_id=str(bdf).lower() if bdf else None,
                source="amdsmi",
                compute_units=cus if isinstance(cus, int) and 0 < cus < 0xFFFFFFFF else None,
                kfd_node=kfd.get("node_id") if isinstance(kfd.get("node_id"), int) else None,
            )
        )
    if all(g.kfd_node is not None for g in gpus):
        gpus.sort(key=lambda g: g.kfd_node)  # type: ignore[arg-type, return-value]
        for i, g in enumerate(gpus):
            g.index = i
    return gpus


def merge_with_kfd(primary: list[GpuInfo], kfd: list[GpuInfo]) -> list[GpuInfo]:
    """Give amdsmi's (or rocminfo's) GPUs KFD's order and ids, matched by PCI address then node.

    amdsmi numbers GPUs by its own enumeration and its UUID is not the one ROCR_VISIBLE_DEVICES
    takes; KFD's node order is HIP's order and its unique_id is the runtime's UUID. A GPU KFD does
    not show is left out: the kernel hides GPUs the device cgroup denies (a container given only
    some of them), and HIP will not see it either.
    """
    if not kfd:
        return primary
    by_bdf = {g.pci_bus_id: g for g in kfd if g.pci_bus_id}
    by_node = {g.kfd_node: g for g in kfd if g.kfd_node is not None}
    merged: list[GpuInfo] = []
    for g in primary:
        k = by_bdf.get(g.pci_bus_id) if g.pci_bus_id else None
        if k is None and g.kfd_node is not None:
            k = by_node.get(g.kfd_node)
        if k is None:
            continue
        g.index = k.index
        g.kfd_node = k.kfd_node
        g.render_minor = k.render_minor
        g.uuid = k.uuid or g.uuid
        g.integrated = k.integrated
        g.pci_bus_id = g.pci_bus_id or k.pci_bus_id
        if g.arch == "unknown":
            g.arch = k.arch
        if not g.memory_total_bytes:
            g.memory_total_bytes = k.memory_total_bytes
        if g.memory_free_bytes is None:
            g.memory_free_bytes = k.memory_free_bytes
        if g.compute_units is None:
            g.compute_units = k.compute_units
        merged.append(g)
    merged.sort(key=lambda g: g.index)
    return merged


# --------------------------------------------------------------------------- probe


def probe(
    root: Path = Path("/"),
    timeout: float = DEFAULT_TIMEOUT,
    *,
    runner: Runner | None = None,
    use_library: bool | None = None,
    log: ProbeLog | None = None,
) -> list[GpuInfo]:
    """AMD GPUs under ``root``. Never raises; what each step did goes to ``log``.

    ``root`` other than "/" is a captured tree: the library is not consulted (it would describe
    this machine, not the tree) unless ``use_library`` says so, and ``rocminfo`` runs only
    through an explicit ``runner`` (tests replay captured output). The library step always
    runs in a real child interpreter.
    """
    log = log if log is not None else ProbeLog()
    live = root == Path("/")
    if use_library is None:
        use_library = live
    if runner is None and live:
        runner = run_command

    try:
        nodes = read_kfd_topology(root)
    except OSError as exc:  # a sysfs that vanishes mid-read (driver unloading)
        nodes = None
        log.warnings.append(f"amd.kfd: reading the topology failed: {exc}")
    driver = amdgpu_driver(root)
    if nodes is None and driver is None and not (root / "dev/kfd").exists():
        why = "no amdgpu driver (no /sys/module/amdgpu, /sys/class/kfd or /dev/kfd)"
        for name in ("amd.amdsmi", "amd.kfd", "amd.rocminfo"):
            log.record(name, "unavailable", why)
        return []
    kfd_gpus = gpus_from_kfd(nodes, driver) if nodes else []

    # 1. amdsmi
    found: list[GpuInfo] = []
    if not use_library:
        log.record("amd.amdsmi", "skipped", "not the live system" if not live else "disabled")
    elif not module_installed("amdsmi"):
        log.record("amd.amdsmi", "unavailable", "python module amdsmi not installed")
    else:
        listed = _probe_amdsmi(timeout, run_command, log)
        found = merge_with_kfd(listed, kfd_gpus)
        if len(found) < len(listed):
            log.warnings.append(
                f"amdsmi lists {len(listed)} AMD GPU(s) but the KFD topology shows {len(found)}; the others "
                f"are not granted to this process (a container given only some GPUs) and are left out"
            )

    # 2. KFD topology
    if found:
        detail = f"{len(kfd_gpus)} GPU node(s), used for order and ids" if kfd_gpus else "no GPU nodes"
        log.record("amd.kfd", "ok" if kfd_gpus else "skipped", detail, len(kfd_gpus))
    elif nodes is None:
        why = "no /sys/class/kfd (amdgpu not loaded)" if driver is None else "amdgpu loaded but no KFD topology"
        log.record("amd.kfd", "unavailable", why)
    elif not kfd_gpus:
        log.record("amd.kfd", "empty", f"{len(nodes)} node(s), none a GPU")
    else:
        found = kfd_gpus
        log.record("amd.kfd", "ok", f"{len(found)} GPU(s)", len(found))

    # 3. rocminfo
    if found:
        log.record("amd.rocminfo", "skipped", "an earlier probe answered")
    elif runner is None:
        log.record("amd.rocminfo", "skipped", "not the live system")
    else:
        found = _probe_rocminfo(timeout, runner, log)

    if not found and driver is not None and nodes is None:
        if (root / "dev/kfd").exists():
            log.warnings.append(
                "/dev/kfd exists but /sys/class/kfd/kfd/topology cannot be read; a container needs "
                "/sys from the host (docker does this by default) for ROCm to enumerate GPUs"
            )
        else:
            log.warnings.append(
                "the amdgpu driver is loaded but there is no KFD (/sys/class/kfd, /dev/kfd): the kernel "
                "was built without HSA_AMD, so ROCm cannot use the GPU"
            )
    return found


def _probe_amdsmi(timeout: float, runner: Runner, log: ProbeLog) -> list[GpuInfo]:
    data = run_library_probe("amd.amdsmi", _AMDSMI_SCRIPT, timeout, runner, log)
    if data is None:
        return []
    if "error" in data:
        log.record("amd.amdsmi", "failed", str(data["error"]))
        return []
    gpus = parse_amdsmi_records(data.get("gpus", []))
    errors = sorted({e for rec in data.get("gpus", []) for e in rec.get("errors", [])})
    detail = f"{len(gpus)} GPU(s)" + (f"; partial: {'; '.join(errors)[:300]}" if errors else "")
    log.record("amd.amdsmi", "ok" if gpus else "empty", detail, len(gpus))
    return gpus


def _probe_rocminfo(timeout: float, runner: Runner, log: ProbeLog) -> list[GpuInfo]:
    res = runner(["rocminfo"], timeout)
    if res.failure == "not_found":
        log.record("amd.rocminfo", "unavailable", "rocminfo not installed")
        return []
    if not res.ok:
        log.record("amd.rocminfo", "timeout" if res.failure == "timeout" else "failed", _rocminfo_why(res))
        return []
    gpus = parse_rocminfo(res.stdout)
    log.record("amd.rocminfo", "ok" if gpus else "empty", f"{len(gpus)} GPU agent(s)", len(gpus))
    return gpus


def _rocminfo_why(res: CommandResult) -> str:
    # rocminfo explains a device-permission failure on stdout before exiting non-zero.
    text = res.stdout + res.stderr
    for line in text.splitlines():
        if "Unable to open /dev/kfd" in line or "Permission denied" in line:
            return line.strip()
    return res.describe()


# --------------------------------------------------------------------------- device nodes


def device_nodes(
    root: Path,
    gpus: Sequence[GpuInfo],
    *,
    access: Callable[[Path, int], bool] = os.access,
) -> list[DeviceNode]:
    """/dev/kfd plus each GPU's render node: the ROCm runtime opens all of them read-write."""
    paths = ["/dev/kfd"] + [f"/dev/dri/renderD{g.render_minor}" for g in gpus if g.render_minor]
    nodes = []
    for p in paths:
        local = root / p.lstrip("/")
        exists = local.exists()
        nodes.append(
            DeviceNode(
                path=p,
                exists=exists,
                readable=exists and access(local, os.R_OK),
                writable=exists and access(local, os.W_OK),
            )
        )
    return nodes
