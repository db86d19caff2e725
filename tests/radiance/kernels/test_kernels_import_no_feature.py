"""`radiance/kernels/` is a library with one direction: features import kernels, never the reverse."""
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
