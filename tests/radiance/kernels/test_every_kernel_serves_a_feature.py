"""Every kernel under radiance/kernels serves a feature: some module outside kernels/ imports it.

A kernel nothing imports still costs an AOT build per arch, a config table, tests and a benchmark
(draft_confidence and ngram_match outlived the dynamic-draft that used them, issue 39). Read statically
(ast), so the check needs neither torch nor Triton."""
from __future__ import annotations

import ast
from pathlib import Path

RADIANCE = Path(__file__).resolve().parents[3] / "radiance"
KERNELS = RADIANCE / "kernels"
# The library's own machinery: no op of its own, imported by the kernels rather than by features.
INFRASTRUCTURE = {"__init__", "aot", "device", "dispatch", "shipped"}


def _literal(path: Path, name: str):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return ast.literal_eval(node.value)
    raise LookupError(f"{path.name} has no {name}")


def imported_modules(path: Path, package_root: Path) -> set[str]:
    """Dotted names ``path`` imports (``from a import b`` counts as a and a.b), relative ones resolved."""
    here = list(path.relative_to(package_root.parent).with_suffix("").parts)[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here[:len(here) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def unserved(kernel_modules, package_root: Path, kernels_dir: Path) -> list[str]:
    """The kernel modules no module of ``package_root`` outside ``kernels_dir`` imports."""
    imported = set()
    for path in package_root.rglob("*.py"):
        if kernels_dir not in path.parents:
            imported |= imported_modules(path, package_root)
    return sorted(m for m in kernel_modules if m not in imported)


def test_every_kernel_module_is_listed_for_the_aot_build():
    """So the list below is the whole library: a new kernel file cannot escape the check."""
    kernels = {m.rsplit(".", 1)[1] for m in _literal(KERNELS / "aot.py", "KERNEL_MODULES")}
    helpers = set(_literal(KERNELS / "aot.py", "HELPER_MODULES"))
    files = {p.stem for p in KERNELS.glob("*.py")}
    assert files - INFRASTRUCTURE == kernels | helpers


def test_every_kernel_serves_a_feature():
    kernels = _literal(KERNELS / "aot.py", "KERNEL_MODULES")
    assert unserved(kernels, RADIANCE, KERNELS) == []


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
