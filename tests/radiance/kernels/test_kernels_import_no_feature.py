"""`radiance/kernels/` is a library with one direction: features import kernels, never the reverse; and
inside it a kernel reaches another module only through its public names (shared pieces live in the
helper modules, fp8_common and w4_common)."""
from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[3] / "radiance" / "kernels"
FEATURE_PACKAGES = ("draft", "w4", "fp8_stream", "lmhead_int4", "report")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from kernels/, one dot is radiance.kernels, two is radiance
                base = ".".join(["radiance", "kernels"][: 3 - node.level] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def test_no_kernel_module_imports_a_feature_package():
    bad = {}
    for path in sorted(KERNELS.rglob("*.py")):
        hits = sorted(m for m in _imports(path)
                      if any(m == f"radiance.{p}" or m.startswith(f"radiance.{p}.") for p in FEATURE_PACKAGES))
        if hits:
            bad[str(path.relative_to(KERNELS))] = hits
    assert bad == {}, bad


def test_the_check_sees_a_feature_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from ..w4 import quant\nfrom radiance.draft import controller\n")
    assert {"radiance.w4", "radiance.draft"} <= _imports(probe)


def _private_imports(path: Path) -> list[str]:
    """``module.name`` for every underscore name ``path`` imports from another radiance.kernels module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["radiance", "kernels"][: 3 - node.level] + ([base] if base else []))
            if base.startswith("radiance.kernels") and base != f"radiance.kernels.{path.stem}":
                out += [f"{base}.{a.name}" for a in node.names if a.name.startswith("_")]
    return out


def test_no_kernel_module_imports_another_modules_privates():
    bad = {str(p.relative_to(KERNELS)): hits for p in sorted(KERNELS.rglob("*.py")) if (hits := _private_imports(p))}
    assert bad == {}, bad


def test_the_check_sees_a_private_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from .w4a16_gemm import LARGE_M, _counters\nfrom .probe import _own\n")
    assert _private_imports(probe) == ["radiance.kernels.w4a16_gemm._counters"]
