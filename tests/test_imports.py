"""The project's import graph, read statically (ast): no module of radiance/ or launcher/ imports itself back
through others, and none imports another module's private (leading underscore) names.

Every import statement counts, at module level or deferred inside a function: a deferred import only moves
a cycle to the first call (fp8_stream's block.py <-> linear.py, issue 39, was deferred). For cycles, imports
under ``if TYPE_CHECKING:`` do not count (they never run); for private names they do (a type is an interface too). Importing ``a.b.c`` runs
``a`` and ``a.b`` too, except from inside them (a module importing its own package's ``__init__`` is how
packages load).
"""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("radiance", "launcher")

# Known exceptions, each to be fixed and taken off: an entry whose modules are gone is ignored; one whose
# modules still exist must still hold (one fixed is taken off the list, so it cannot come back unnoticed).
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()


def _name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _imports(tree: ast.AST):
    """(Import/ImportFrom, whether it runs): everywhere, False under ``if TYPE_CHECKING:``."""
    stack = [(tree, True)]
    while stack:
        node, runs = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend((n, False) for n in node.body)
            stack.extend((n, runs) for n in node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, runs
        stack.extend((n, runs) for n in ast.iter_child_nodes(node))


@cache
def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """(module -> the project modules it imports, [(importer, module, private name)])."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for mod, path in mods.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node, runs in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg = here[:len(here) - (node.level - 1)]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        targets.append(sub)
                        continue
                    targets.append(base)
                    if (base in mods and base != mod and alias.name.startswith("_")
                            and not alias.name.startswith("__")):
                        private.append((mod, base, alias.name))
            for target in targets if runs else ():
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # a.b.c runs a and a.b first
                    dep = ".".join(parts[:i])
                    if dep in mods and dep != mod and not mod.startswith(dep + "."):
                        graph[mod].add(dep)
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    scc.add(m)
                    if m == node:
                        break
                if len(scc) > 1:
                    out.append(frozenset(scc))
    return out


def _in(pkg: str, mod: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_the_scanner_sees_both_packages():
    graph, _ = _graph()
    assert {"launcher.profile", "radiance.plugin", "radiance.draft"} <= set(graph)
    assert "launcher.gate.config" in graph["launcher.profile"] and "radiance.envs" in graph["launcher.profile"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    mods = _modules()
    found = {c for c in _cycles(_graph()[0]) if any(_in(package, m) for m in c)}
    live_known = {c for c in KNOWN_CYCLES if c <= set(mods) and any(_in(package, m) for m in c)}
    new = found - live_known
    assert not new, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    fixed = live_known - found
    assert not fixed, f"no longer cycles, take them off KNOWN_CYCLES: {sorted(map(sorted, fixed))}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_imported_across_modules(package):
    mods = _modules()
    found = {p for p in _graph()[1] if _in(package, p[0])}
    live_known = {p for p in KNOWN_PRIVATE if p[0] in mods and p[1] in mods and _in(package, p[0])}
    new = found - live_known
    assert not new, "private names imported from another module (make them public or move them): " + \
        "; ".join(f"{a} imports {n} from {b}" for a, b, n in sorted(new))
    fixed = live_known - found
    assert not fixed, f"fixed, take them off KNOWN_PRIVATE: {sorted(fixed)}"


def test_the_profile_schema_loads_without_the_gate_runner():
    """The container entry point and every Ray replica parse a profile; the gate runner (HTTP client,
    GSM8K, the target check) must not come with it."""
    import subprocess
    import sys

    code = ("import sys, launcher.profile; print(sorted(m for m in sys.modules if m.startswith('launcher.gate')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "['launcher.gate', 'launcher.gate.config']", out.stdout + out.stderr


def test_engines_get_their_door_only_through_the_lifecycle():
    """One engine lifecycle (launcher/lifecycle.py): no other module makes an engine's socket directory or
    removes one, so every engine radiance starts has the same door and leaves nothing behind."""
    door_names = {"private_socket_dir", "remove_socket_dir"}
    users = set()
    for mod, path in _modules().items():
        if mod in ("launcher.engine_link", "launcher.lifecycle"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in door_names:
                users.add(mod)
    assert users == set(), f"make the engine's door through launcher.lifecycle: {sorted(users)}"
