"""The canary: every vLLM attribute a patch hooks, relies on or wraps where present still exists in the
pinned vLLM, and every patch accepts its version. It walks the patches radiance/plugin.py installs (its
core modules and every feature's module, all switched on), so a new patch is covered by being listed
there. If vLLM moves an attribute, this fails before a user's server declines."""
from __future__ import annotations

import pytest

from radiance import patching, plugin
from radiance.features import FEATURES

vllm = pytest.importorskip("vllm")


def _every_patch(monkeypatch) -> list[patching.Patch]:
    for feat in FEATURES:
        monkeypatch.setenv(feat.knob, "1")
    patches, declined = plugin.load_patches()
    assert [o for o in declined if o.status != "disabled"] == []   # every module imports
    return patches


def _paths(patch: patching.Patch) -> tuple[str, ...]:
    optional = getattr(patch, "optional_hook", None)
    return (*patch.hook_points, *getattr(patch, "relied_on", ()), *((optional,) if optional else ()))


def test_every_patch_module_is_walked(monkeypatch):
    modules = {type(p).__module__ for p in _every_patch(monkeypatch)}
    assert {f.module for f in FEATURES} <= modules and set(plugin.CORE_MODULES) <= modules


def test_every_hooked_vllm_attribute_exists_in_the_pinned_vllm(monkeypatch):
    missing = {}
    for patch in _every_patch(monkeypatch):
        for path in _paths(patch):
            try:
                patching.resolve(path)
            except LookupError as exc:
                missing[f"{patch.name}: {path}"] = str(exc)
    assert missing == {}


def test_every_patch_accepts_the_pinned_vllm(monkeypatch):
    assert {p.name: p.check_static(vllm.__version__) for p in _every_patch(monkeypatch)
            if p.check_static(vllm.__version__) is not None} == {}
