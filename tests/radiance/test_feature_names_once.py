"""The four features are listed in one module (radiance/features.py); every other module asks it."""
from __future__ import annotations

import ast
from pathlib import Path

from radiance.features import NAMES

REPO = Path(__file__).resolve().parents[2]
HOME = REPO / "radiance" / "features.py"
SPELLINGS = set(NAMES) | {n.replace("_", "-") for n in NAMES}


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


def test_no_module_but_features_py_lists_the_features():
    found = {}
    for root in ("radiance", "launcher", "images", "tools"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path != HOME and (lines := _lists_of_features(path)):
                found[str(path.relative_to(REPO))] = lines
    assert found == {}, f"feature names listed outside radiance/features.py: {found}"


def test_the_scan_sees_a_list(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('X = ("dynamic_draft", "int4-head")\nY = {"w4_drafter": 1, "fp8_stream": 2}\n')
    assert _lists_of_features(probe) == [1, 2]
    assert _lists_of_features(HOME)   # the one home does list them
