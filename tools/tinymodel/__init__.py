"""The tiny test models of the Qwen3-Next family (``config.ARCHS``: a Qwen3-Next and a Qwen3.5):
the base of every e2e test; the trained ones committed under models/ are the appliance's embedded
default. It lives beside the package, not in it: the launcher reaches it through
``launcher.paths.tinymodel`` only to generate a random-weight ``builtin:`` model.

``ensure(cache_dir, seed, arch)`` returns a ready random-weight checkpoint directory, generating it
on first use; ``trained_model_dir(arch)`` the committed trained one. Importing this package stays
cheap (no torch, no tokenizers): the launcher imports it to read a builtin model's config.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

MODEL_PREFIX = "tiny-qwen3next-s"

TRAINED_MODEL = "tiny-qwen3next-trained"
DEFAULT_ARCH = "tiny-qwen3next"

__all__ = ["DEFAULT_ARCH", "MODEL_PREFIX", "TRAINED_MODEL", "ensure", "is_complete", "model_dir_name",
           "trained_model_dir"]


def model_dir_name(seed: int, arch: str = DEFAULT_ARCH) -> str:
    return f"{arch}-s{seed}"


def is_complete(model_dir: Path) -> bool:
    """True when ``model_dir`` holds a finished model written by the current generator format."""
    from tools.tinymodel.generate import FORMAT_VERSION, METADATA_FILE

    try:
        meta = json.loads((Path(model_dir) / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return meta.get("format_version") == FORMAT_VERSION


def _make_readable(model_dir: Path) -> None:
    # mkdtemp and safetensors create owner-only entries; a container user other than ours reads them.
    os.chmod(model_dir, 0o755)
    for path in model_dir.iterdir():
        os.chmod(path, 0o644)


def generate_into(target: Path, seed: int = 0, gsm8k_dir: Path | None = None, **variant) -> Path:
    """Generate into a temp sibling, then swap it into place, so readers never see a partial model.

    ``variant``: ``write_model``'s keyword options (arch, mlp_only_layers, embed_scale, norm_std,
    fp8_blocks)."""
    from tools.tinymodel.generate import write_model

    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write_model(tmp, seed=seed, gsm8k_dir=gsm8k_dir, **variant)
        _make_readable(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.rename(target, old / target.name)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _arch(name: str):
    from tools.tinymodel import config

    try:
        return config.ARCHS[name]
    except KeyError:
        raise ValueError(f"unknown tiny architecture {name!r}: one of {', '.join(config.ARCHS)}") from None


def ensure(cache_dir: Path, seed: int = 0, arch: str = DEFAULT_ARCH) -> Path:
    """Return ``cache_dir/<arch>-s{seed}``, generating it once (process-safe) if needed."""
    spec = _arch(arch)
    cache_dir = Path(cache_dir).expanduser()
    target = cache_dir / model_dir_name(seed, arch)
    if is_complete(target):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{target.name}.lock", "w") as lock:
        # Two launchers starting at once: the second waits here, then finds the model complete.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(target):
            return target
        print(
            f"radiance: generating the tiny test model {arch} ({spec.architecture}, seed {seed}) into {target} ...",
            file=sys.stderr,
            flush=True,
        )
        start = time.monotonic()
        generate_into(target, seed=seed, arch=spec)
        print(f"radiance: tiny model ready in {time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)
    return target


def trained_model_dir(arch: str = DEFAULT_ARCH) -> Path | None:
    """The committed trained variant (``models/<arch>-trained`` in a source checkout), if present.

    Its MTP layer agrees with the target, so acceptance figures measured on it mean something and
    its completions are readable text; the random model needs no files beyond the package.
    """
    _arch(arch)
    path = Path(__file__).resolve().parents[2] / "models" / f"{arch}-trained"
    return path if is_complete(path) else None
