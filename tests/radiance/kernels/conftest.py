"""Checks every kernel test file makes the same way: AOT builds for the HIP targets, and the
Triton kernel run in the interpreter. They are fixtures that return callables because this
folder is not a package (a test module cannot import a helper module by a stable name)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from radiance.kernels import aot

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent

# Every kernel must build for RDNA4 and CDNA3; Triton compiles HIP targets on a CPU-only machine.
AOT_ARCHS = ("gfx1201", "gfx942")


@pytest.fixture(params=AOT_ARCHS)
def aot_arch(request) -> str:
    return request.param


@pytest.fixture
def aot_specs():
    """``aot_specs(kernel, arch)``: the AOT launches of one kernel (names ``kernel[...]``) on
    ``arch``'s device."""
    pytest.importorskip("triton")

    def specs(kernel: str, arch: str) -> list[aot.AotSpec]:
        return [s for s in _specs_for(arch) if s.name.startswith(f"{kernel}[")]

    return specs


_SPECS: dict[str, list] = {}


def _specs_for(arch: str) -> list:
    if arch not in _SPECS:
        _SPECS[arch] = aot.specs_for(arch)
    return _SPECS[arch]


@pytest.fixture
def aot_compile():
    """``aot_compile(spec, arch)``: compiles an AotSpec for ``arch``, asserts that a binary came
    out, and returns the compiled kernel for further checks."""
    pytest.importorskip("triton")

    def compile_spec(spec: aot.AotSpec, arch: str):
        compiled = aot.compile_spec(spec, arch)
        assert compiled.asm.get(aot.binary_kind(arch)), spec.name
        return compiled

    return compile_spec


@pytest.fixture
def run_interpreted():
    """``run_interpreted(script, timeout=600)``: runs ``script`` with TRITON_INTERPRET=1 in a
    fresh interpreter (Triton reads the flag at import, so it cannot be turned on in this
    process), with the repo and this folder importable (scripts reuse the test files' input
    makers); asserts that it exited 0 and returns its stdout."""
    def run(script: str, timeout: int = 600) -> str:
        path = [str(HERE), str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(path)}
        out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                             check=False, text=True, timeout=timeout)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    return run


@pytest.fixture
def interpreter_ok(run_interpreted):
    """``interpreter_ok(script, timeout=600)``: runs a kernel-against-reference script (it prints
    OK, or MISMATCH and the cases) under ``run_interpreted`` and asserts that it printed OK; the
    fp8 scripts share their loop and comparison through fp8_interpreted.py."""
    pytest.importorskip("triton")

    def check(script: str, timeout: int = 600) -> None:
        out = run_interpreted(script, timeout=timeout)
        assert out.strip().endswith("OK"), out[-3000:]

    return check
