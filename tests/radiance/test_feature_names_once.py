"""Feature facts are written once: the features, their switches and their rules in radiance/features.py,
the other knobs in radiance/envs.py, the vLLM versions in radiance/versions.py; every other module asks."""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from radiance import envs
from radiance.features import NAMES, Setup

REPO = Path(__file__).resolve().parents[2]
HOME = REPO / "radiance" / "features.py"
SPELLINGS = set(NAMES) | {n.replace("_", "-") for n in NAMES}
# What a setup rule reads: features.Setup's fields, and the profile's spelling of the drafter (drafter.type).
SETUP_FIELDS = {f.name for f in dataclasses.fields(Setup)} | {"type"}
VERSION = re.compile(r"v?\d+\.\d+(\.\d+)?")


def _sources(*roots: str):
    for root in roots:
        yield from sorted((REPO / root).rglob("*.py"))


def _lists_of_features(path: Path) -> list[int]:
    """Lines of list/tuple/set/dict literals naming two or more features."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        named = {e.value for e in items if isinstance(e, ast.Constant) and e.value in SPELLINGS}
        if len(named) >= 2:
            out.append(node.lineno)
    return out


def _restated_rules(path: Path) -> list[int]:
    """Lines of conditions that read a feature's switch and a setup field together (``if
    f.fp8_stream.enabled and p.tp < 2``): a feature's setup rule, written again."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.BoolOp, ast.IfExp)):
            cond = node
        elif isinstance(node, (ast.If, ast.While, ast.Assert)):
            cond = node.test
        else:
            continue
        attrs = {n.attr for n in ast.walk(cond) if isinstance(n, ast.Attribute)}
        if attrs & set(NAMES) and attrs & SETUP_FIELDS:
            out.add(node.lineno)
    return sorted(out)


def _declared_names(path: Path) -> list[str]:
    """RADIANCE_* names given as the name of a Knob(...) or Feature(...) row."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Knob", "Feature"):
            out += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and a.value.startswith(envs.PREFIX)]
    return out


def _outside_home(scan) -> dict[str, list[int]]:
    """``scan``'s lines in every module of the packages and tools but features.py."""
    return {str(path.relative_to(REPO)): lines for path in _sources("radiance", "launcher", "images", "tools")
            if path != HOME and (lines := scan(path))}


def test_no_module_but_features_py_lists_the_features():
    found = _outside_home(_lists_of_features)
    assert found == {}, f"feature names listed outside radiance/features.py: {found}"


def test_no_module_but_features_py_writes_a_feature_rule():
    found = _outside_home(_restated_rules)
    assert found == {}, f"feature rules restated outside radiance/features.py (ask features.setup_refusal): {found}"


def test_every_knob_name_is_written_in_one_declaration():
    declared = []
    for path in _sources("radiance", "launcher"):
        declared += [(name, path.relative_to(REPO)) for name in _declared_names(path)]
    names = [name for name, _ in declared]
    assert sorted(names) == sorted(envs.KNOBS), "every knob declared, and declared once"
    where = {name: str(path) for name, path in declared}
    assert {where[f] for f in envs.KNOBS if f in where} == {"radiance/envs.py", "radiance/features.py"}


def test_no_module_but_versions_py_writes_a_version():
    found = [f"{path.relative_to(REPO)}:{node.lineno}: {node.value}"
             for path in _sources("radiance", "launcher", "images")
             if path.name != "versions.py"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and VERSION.fullmatch(node.value)]
    assert found == [], f"versions written outside radiance/versions.py: {found}"


def test_the_scans_see_what_they_look_for(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('X = ("dynamic_draft", "int4-head")\nY = {"w4_drafter": 1, "fp8_stream": 2}\n'
                     'if f.fp8_stream.enabled and (p.tp < 2 or p.pp != 1):\n    pass\n'
                     'ok = d.type == "mtp" if f.dynamic_draft.enabled else True\n'
                     'if f.dynamic_draft.enabled:\n    pass\n'
                     'Knob("RADIANCE_PROBE", "0", None, "doc")\n')
    assert _lists_of_features(probe) == [1, 2]
    assert _restated_rules(probe) == [3, 5]
    assert _declared_names(probe) == ["RADIANCE_PROBE"]
    assert _lists_of_features(HOME)   # the one home does list them
