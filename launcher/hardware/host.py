"""Host facts the GPU checks lean on: memory (for the CPU platform) and group membership
(for the hint when /dev/kfd cannot be opened)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .types import HostInfo

# Distributions hand ROCm's device nodes to "render" (/dev/kfd, /dev/dri/renderD*) and, on
# older ones, "video"; ROCm's install guide asks for membership in both.
GPU_GROUPS = ("render", "video")


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` -> {"MemTotal": bytes, ...}; the kernel prints kB (KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        out[key.strip()] = value * 1024 if unit == "kb" else value
    return out


def parse_group_file(text: str) -> dict[str, tuple[int, list[str]]]:
    """``/etc/group`` -> {name: (gid, members)}."""
    groups: dict[str, tuple[int, list[str]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) < 3:
            continue
        try:
            gid = int(parts[2])
        except ValueError:
            continue
        members = [m for m in (parts[3].split(",") if len(parts) > 3 else []) if m]
        groups[parts[0]] = (gid, members)
    return groups


def current_user_groups(groups: dict[str, tuple[int, list[str]]]) -> list[str]:
    """Names of the groups this process holds (supplementary + primary)."""
    gids = set(os.getgroups()) | {os.getgid()}
    names = {name for name, (gid, _) in groups.items() if gid in gids}
    try:  # groups from NSS (LDAP, sssd) are not in /etc/group
        import grp

        for gid in gids:
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                pass
    except ImportError:
        pass
    return sorted(names)


def probe_host(root: Path = Path("/"), *, user_groups: Sequence[str] | None = None) -> HostInfo:
    info = HostInfo(cpu_count=os.cpu_count() if root == Path("/") else None)
    try:
        mem = parse_meminfo((root / "proc/meminfo").read_text())
        info.memory_total_bytes = mem.get("MemTotal")
        info.memory_available_bytes = mem.get("MemAvailable")
    except OSError:
        pass
    try:
        groups = parse_group_file((root / "etc/group").read_text())
    except OSError:
        groups = {}
    if user_groups is None:
        user_groups = current_user_groups(groups) if root == Path("/") else []
    info.user_groups = sorted(user_groups)
    info.missing_gpu_groups = [g for g in GPU_GROUPS if g in groups and g not in info.user_groups]
    return info
