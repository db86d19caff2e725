"""`radiance/kernels/` is a library with one direction: features import kernels, never the reverse; inside
it a kernel reaches another module only through its public names (shared pieces live in the helper
modules, fp8_common and w4_common); and every kernel serves a feature: some module outside kernels/
imports it. A kernel nothing imports still costs an AOT build per arch, a config table, tests and a
benchmark (draft_confidence and ngram_match outlived the dynamic-draft that used them, issue 39). Read
statically (ast)."""
from __future__ import annotations

import ast
from pathlib import Path

RADIANCE = Path(__file__).resolve().parents[3] / "radiance"
KERNELS = RADIANCE / "kernels"
FEATURE_PACKAGES = ("draft", "w4", "fp8_stream", "lmhead_int4", "report")
# The library's own machinery: no op of its own, imported by the kernels rather than by features.
INFRASTRUCTURE = {"__init__", "aot", "device", "dispatch", "shipped"}


def _imports(path: Path, package: tuple[str, ...] = ("radiance", "kernels")) -> set[str]:
    """Dotted names ``path`` (a module of ``package``) imports; ``from a import b`` counts as a and a.b."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: one dot is the module's package, two its parent
                base = ".".join(list(package)[: len(package) + 1 - node.level] + ([base] if base else []))
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


def _literal(path: Path, name: str):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return ast.literal_eval(node.value)
    raise LookupError(f"{path.name} has no {name}")


def unserved(kernel_modules, root: Path, kernels_dir: Path) -> list[str]:
    """The kernel modules no module of the package at ``root`` outside ``kernels_dir`` imports."""
    imported = set()
    for path in root.rglob("*.py"):
        if kernels_dir not in path.parents:
            imported |= _imports(path, path.relative_to(root.parent).parent.parts)
    return sorted(m for m in kernel_modules if m not in imported)


def test_every_kernel_module_is_listed_for_the_aot_build():
    """So the list the next test checks is the whole library: a new kernel file cannot escape it."""
    kernels = {m.rsplit(".", 1)[1] for m in _literal(KERNELS / "aot.py", "KERNEL_MODULES")}
    helpers = set(_literal(KERNELS / "aot.py", "HELPER_MODULES"))
    assert {p.stem for p in KERNELS.glob("*.py")} - INFRASTRUCTURE == kernels | helpers


def test_every_kernel_serves_a_feature():
    assert unserved(_literal(KERNELS / "aot.py", "KERNEL_MODULES"), RADIANCE, KERNELS) == []


def test_the_check_sees_an_orphan(tmp_path):
    root = tmp_path / "radiance"
    (root / "kernels").mkdir(parents=True)
    (root / "feature").mkdir()
    (root / "kernels" / "used.py").write_text("")
    (root / "kernels" / "orphan.py").write_text("")
    (root / "kernels" / "helper.py").write_text("from . import orphan\n")  # a kernel's import does not count
    (root / "feature" / "patch.py").write_text("from ..kernels import used\n")
    kernels = ["radiance.kernels.used", "radiance.kernels.orphan"]
    assert unserved(kernels, root, root / "kernels") == ["radiance.kernels.orphan"]
