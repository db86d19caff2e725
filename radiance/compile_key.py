"""The patch set is part of vLLM's compilation cache key.

vLLM 0.32 keeps compiled graphs on disk under a key made of its config hash
(``VllmConfig.compute_hash``) and its known ``VLLM_*`` variables (``envs.compile_factors``); on torch
>= 2.10 the AOT-compiled model is loaded from that key alone, before anything is traced. No ``RADIANCE_*``
knob is in either, so a graph compiled by a stock run was loaded by a patched one on the same machine
(and the other way round): a 4-bit layer whose ``weight`` is an empty tensor then meets inductor code
written for the bf16 weight, and the engine dies in the compiled forward.

Hook (vLLM 0.32.0): ``VllmConfig.compute_hash`` returns its hash mixed with radiance's version and the
parsed value of every knob that shapes the engine (``envs.ENGINE_KNOBS``). vLLM's own factors are kept as
they are, so two runs with the same patch set share one cache and any two sets get two. Always on with
the plugin; with ``RADIANCE_ENABLE=0`` the plugin installs nothing and the key is vLLM's own.
"""
from __future__ import annotations

import hashlib

from . import envs
from .patching import Hooks, Patch

_CONFIG = "vllm.config.vllm.VllmConfig"


def fingerprint(environ: dict[str, str] | None = None) -> str:
    """radiance's version and the engine knobs' values, as one stable string."""
    from . import __version__

    parts = [f"radiance={__version__}"]
    for name in envs.ENGINE_KNOBS:
        try:
            value = envs.get(name, environ)
        except envs.KnobError as exc:  # the plugin declines on a bad knob; keep the key distinct anyway
            value = f"invalid:{exc}"
        parts.append(f"{name}={value!r}")
    return ";".join(parts)


def mixed(vllm_hash: str, print_: str) -> str:
    """vLLM's hash with ours folded in, the same length as vLLM's (it names cache directories)."""
    return hashlib.sha256(f"{vllm_hash}|{print_}".encode()).hexdigest()[: len(vllm_hash) or 10]


class ConfigHooks(Hooks):
    """``VllmConfig``."""

    target = _CONFIG
    via = "_radiance_compile_key"

    def compute_hash(self, *args, **kwargs):
        return mixed(self._orig_compute_hash(*args, **kwargs), fingerprint())


class CompileKeyPatch(Patch):
    name = "compile_key.vllm_config_hash"
    feature = ""  # always on with the plugin
    hook_points = (f"{_CONFIG}.compute_hash",)

    def apply(self) -> None:
        self.hook(ConfigHooks)


PATCHES = [CompileKeyPatch()]
