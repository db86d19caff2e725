"""The patch set is part of vLLM's compile-cache key: two feature sets give two keys, one set gives one.

The keys checked are the ones vLLM 0.32 names its cache directories with: the AOT-compiled model's
(``aot_compile_hash_factors``: loaded before anything is traced, the path a stale graph came back by)
and the config hash the inductor cache directory is made of (``VllmConfig.compute_hash``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from radiance import compile_key, envs

ON = {"RADIANCE_DYNAMIC_DRAFT": "1", "RADIANCE_W4_DRAFTER": "1"}


def test_fingerprint_names_every_engine_knob_and_the_version():
    fp = compile_key.fingerprint({})
    assert fp.startswith("radiance=")
    for name in envs.ENGINE_KNOBS:
        assert f"{name}=" in fp
    assert "RADIANCE_LOG_LEVEL" not in fp and "RADIANCE_HOME" not in fp   # launcher and logging knobs


def test_fingerprint_follows_values_not_spelling():
    assert compile_key.fingerprint({}) == compile_key.fingerprint({"RADIANCE_INT4_HEAD": "0"})
    assert compile_key.fingerprint({"RADIANCE_INT4_HEAD": "1"}) == compile_key.fingerprint({"RADIANCE_INT4_HEAD": "on"})
    assert compile_key.fingerprint({}) != compile_key.fingerprint({"RADIANCE_INT4_HEAD": "1"})
    assert compile_key.fingerprint(ON) != compile_key.fingerprint({**ON, "RADIANCE_DRAFT_TAU": "0.3"})


@pytest.fixture
def patched():
    pytest.importorskip("vllm")
    patch = compile_key.CompileKeyPatch()
    assert patch.install("0.32.0").status == "applied"
    yield
    patch.revert()


def _keys():
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import VllmConfig

    cfg = VllmConfig()
    return cfg.compute_hash(), tuple(aot_compile_hash_factors(cfg))


def test_two_feature_sets_two_keys_one_set_one_key(patched, monkeypatch):
    for k in envs.ENGINE_KNOBS:
        monkeypatch.delenv(k, raising=False)
    stock = _keys()
    for k, v in ON.items():
        monkeypatch.setenv(k, v)
    draft = _keys()
    assert draft[0] != stock[0] and draft[1] != stock[1]
    assert _keys() == draft                       # the same set again: the same cache
    monkeypatch.setenv("RADIANCE_INT4_HEAD", "1")
    assert _keys()[1] not in (stock[1], draft[1])
    assert len(draft[0]) == len(stock[0]) == 10   # a directory name as vLLM's


def test_revert_gives_vllm_its_own_key(monkeypatch):
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig

    own = VllmConfig().compute_hash()
    patch = compile_key.CompileKeyPatch()
    patch.install("0.32.0")
    try:
        assert VllmConfig().compute_hash() != own
    finally:
        patch.revert()
    assert VllmConfig().compute_hash() == own


_PROBE = """
import json, sys
from radiance import plugin
plugin.register()
from vllm.config import VllmConfig
print(json.dumps(VllmConfig().compute_hash()))
"""


def _probe(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RADIANCE_")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**base, **env}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_plugin_installs_it_in_every_engine_process():
    """Through the entry point vLLM calls (plugin.register), as an engine core or worker would."""
    pytest.importorskip("vllm")
    off = _probe({"RADIANCE_ENABLE": "0"})
    draft = _probe({"RADIANCE_ENABLE": "1", **ON})
    assert off != draft
