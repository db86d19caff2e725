"""A hook point that is missing makes the plugin decline that patch (one log line) and vLLM
serves stock. Real vLLM, real plugin; only the hook point's presence is taken away."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from .conftest import start

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent


def _first_hook_of(feature: str) -> str | None:
    from radiance import plugin
    from radiance.features import BY_NAME

    knob = BY_NAME[feature].knob
    os.environ[knob] = "1"
    try:
        patches, _ = plugin.load_patches()
    finally:
        del os.environ[knob]
    hooks = [h for p in patches if p.feature == feature for h in p.hook_points]
    return hooks[0] if hooks else None


def test_missing_hook_point_declines_and_vllm_still_serves(tmp_path):
    hook = _first_hook_of("dynamic_draft")
    if hook is None:
        pytest.skip("the dynamic_draft patch module is not built in this version")
    env = {"E2E_REMOVE_HOOK": hook,
           "PYTHONPATH": os.pathsep.join([str(HERE / "remove_hook"), os.environ.get("PYTHONPATH", "")])}
    # the gate is the spine's to prove; this bring-up proves the decline and that vLLM serves
    dep = start(tmp_path, "profiles/tiny-cpu.yaml", extra_env=env, args=("--skip-gate",))
    try:
        assert dep.up.returncode == 0, dep.up.stdout + dep.up.stderr
        r = httpx.post(dep.base + "/v1/completions", timeout=120,
                       json={"model": "tiny", "prompt": "x = [", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"]
        patches = {p["feature"]: p for p in dep.status()["patches"]}
        assert patches["dynamic_draft"]["status"] == "declined"
        assert hook in patches["dynamic_draft"]["reason"]
        log = open(dep.state()["engine_log"]).read()
        declined = [ln for ln in log.splitlines() if "declined dynamic_draft" in ln and hook in ln]
        assert declined, "the decline must be logged"
    finally:
        dep.down()
