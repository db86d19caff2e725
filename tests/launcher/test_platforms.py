"""The platform table (launcher/platforms.py) is the one place a platform's facts are written: the
launcher, the CLI, the Dockerfiles' defaults, pyproject's extras and the RADIANCE_PLATFORM knob agree
with it, and no other file under launcher/ or images/ spells a GPU platform's name."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher import images, platforms
from radiance import envs

REPO = Path(__file__).resolve().parents[2]


def test_rows():
    assert platforms.NAMES == ("rocm", "cuda", "cpu")
    assert platforms.GPU_NAMES == ("rocm", "cuda")
    assert platforms.WANTED == ("auto", *platforms.NAMES)
    for p in platforms.PLATFORMS.values():
        assert (REPO / p.dockerfile).is_file(), p.dockerfile
        assert images.dockerfile_for(p.name) == p.dockerfile
        assert p.gpu == bool(p.aot_targets) == (p.default_arch is not None) == (p.k8s_gpu_resource is not None)
        if p.gpu:
            assert p.default_arch in p.aot_targets
            assert (REPO / "launcher" / "hardware" / f"{p.probe}.py").is_file()
            assert platforms.for_probe(p.probe) is p


def test_lookups():
    assert platforms.is_gpu("rocm") and not platforms.is_gpu("cpu")
    assert not platforms.is_gpu("auto") and not platforms.is_gpu(None) and not platforms.is_gpu("tpu")
    with pytest.raises(ValueError, match="expected one of rocm, cuda, cpu"):
        platforms.get("tpu")


def test_vllm_packages_are_pyprojects_extras():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in ("cpu", "cuda"):
        assert extras[name] == [platforms.get(name).vllm_package]


def test_the_knob_offers_the_same_names():
    # radiance/envs.py may not import the launcher, so it repeats the names; here they are kept equal
    assert set(envs.KNOBS["RADIANCE_PLATFORM"].choices) == set(platforms.NAMES)
    assert envs.KNOBS["RADIANCE_PLATFORM"].default in platforms.NAMES


@pytest.mark.parametrize("command", [["build"], ["bench"], ["export", "k8s"]])
def test_cli_choices_come_from_the_table(command):
    from launcher.cli import cli

    out = CliRunner().invoke(cli, [*command, "--help"], catch_exceptions=False, env={"COLUMNS": "200"}).output
    choices = re.search(r"--platform \[([^\]]+)\]", out)
    assert choices, out
    listed = tuple(choices[1].replace(" ", "").split("|"))
    assert listed in (platforms.NAMES, platforms.WANTED)


def test_gpu_platform_names_are_written_once():
    """`grep -rln '"rocm"' launcher images` finds the table alone (the issue's measure); the same for cuda."""
    for name in platforms.GPU_NAMES:
        hits = sorted(str(p.relative_to(REPO)) for root in ("launcher", "images") for p in (REPO / root).rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts and f'"{name}"' in p.read_text(errors="ignore"))
        assert hits == ["launcher/platforms.py"], (name, hits)
