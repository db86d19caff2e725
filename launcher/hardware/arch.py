"""GPU architecture names: decoding, families, and the fp8 flavour each one computes in.

The launcher never imports ``radiance``; this table mirrors what
``radiance.kernels.dispatch.fp8_dtype_for_device`` decides inside the engine, but by name, so
``radiance check`` can answer on a machine where torch cannot see the GPU.
"""

from __future__ import annotations

import re

FP8_E4M3FN = "float8_e4m3fn"  # OCP fp8: gfx12 (RDNA4), gfx950 (MI350), NVIDIA sm_89+
FP8_E4M3FNUZ = "float8_e4m3fnuz"  # gfx94x (MI300) only: no negative zero, bias 8

_GFX = re.compile(r"^gfx([0-9]{1,2})([0-9a-f])([0-9a-f])$")
_SM = re.compile(r"^(?:sm_?|compute_?)([0-9]{2,3})[a-z]?$")
_CC = re.compile(r"^([0-9]{1,2})\.([0-9])$")


def gfx_target_version_to_arch(version: int) -> str:
    """KFD's ``gfx_target_version`` (major*10000 + minor*100 + stepping) to an LLVM target name.

    The minor and stepping are each printed as one hex digit, which is how LLVM spells
    gfx90a (9.0.10 -> 90010) and gfx90c (9.0.12 -> 90012); 120001 -> gfx1201, 90402 -> gfx942.
    """
    if version <= 0:
        raise ValueError(f"gfx_target_version {version} names no GPU (CPU nodes report 0)")
    major, rest = divmod(version, 10000)
    minor, stepping = divmod(rest, 100)
    if minor > 15 or stepping > 15:
        raise ValueError(f"gfx_target_version {version}: minor {minor}/stepping {stepping} do not fit one hex digit")
    return f"gfx{major}{minor:x}{stepping:x}"


def arch_to_gfx_target_version(arch: str) -> int:
    m = _GFX.match(normalize_arch(arch))
    if not m:
        raise ValueError(f"{arch!r} is not a gfx target")
    return int(m.group(1)) * 10000 + int(m.group(2), 16) * 100 + int(m.group(3), 16)


def cuda_arch(major: int, minor: int) -> str:
    """Compute capability (9, 0) -> "sm90"; (12, 0) -> "sm120"."""
    return f"sm{major}{minor}"


def cuda_capability(arch: str) -> tuple[int, int] | None:
    """ "sm90"/"sm_90a"/"9.0" -> (9, 0); None for anything that is not an NVIDIA arch."""
    arch = arch.strip().lower()
    m = _CC.match(arch)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _SM.match(arch)
    if m:
        digits = m.group(1)
        return int(digits[:-1]), int(digits[-1])
    return None


def normalize_arch(arch: str) -> str:
    """Drop target features and prefixes: "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-" -> "gfx942",
    "sm_90a" / "9.0" -> "sm90". Unknown spellings come back lower-cased, otherwise untouched."""
    a = arch.strip().lower()
    if "gfx" in a:
        a = a[a.index("gfx") :].split(":")[0]
        return a
    cc = cuda_capability(a)
    if cc is not None:
        return cuda_arch(*cc)
    return a


def is_amd_arch(arch: str) -> bool:
    return normalize_arch(arch).startswith("gfx")


def is_nvidia_arch(arch: str) -> bool:
    return cuda_capability(normalize_arch(arch)) is not None


def arch_family(arch: str) -> str:
    """A coarse family name for messages and capability tables ("cdna3", "rdna4", "hopper", ...)."""
    a = normalize_arch(arch)
    if a.startswith("gfx"):
        m = _GFX.match(a)
        if not m:
            return "unknown"
        major, minor = int(m.group(1)), int(m.group(2), 16)
        if major == 9:
            return {
                (9, 0): "cdna1" if a == "gfx908" else "cdna2" if a == "gfx90a" else "gcn5",
                (9, 4): "cdna3",
                (9, 5): "cdna4",
            }.get((major, minor), "gcn5")
        if major == 10:
            return "rdna1" if minor == 1 else "rdna2"
        if major == 11:
            return "rdna3.5" if minor == 5 else "rdna3"
        if major == 12:
            return "rdna4"
        return "unknown"
    cc = cuda_capability(a)
    if cc is None:
        return "unknown"
    major, minor = cc
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada" if minor >= 9 else "ampere"
    if major == 9:
        return "hopper"
    if major >= 10:
        return "blackwell"
    return "unknown"


def fp8_dtype_for_arch(arch: str) -> str | None:
    """The torch fp8 dtype name kernels use on ``arch``; None when it has no fp8 math.

    gfx94x (MI300) computes in the fnuz variant; RDNA4 (gfx12xx), gfx950 (MI350, OCP fp8 in
    hardware) and NVIDIA from sm_89 (Ada, Hopper, Blackwell) use float8_e4m3fn. Everything
    else (RDNA3, CDNA2, Ampere) has no fp8 units: such a kernel would be emulated at best.
    """
    a = normalize_arch(arch)
    if a.startswith("gfx94"):
        return FP8_E4M3FNUZ
    if a.startswith("gfx12") or a.startswith("gfx95"):
        return FP8_E4M3FN
    cc = cuda_capability(a)
    if cc is not None and cc >= (8, 9):
        return FP8_E4M3FN
    return None
