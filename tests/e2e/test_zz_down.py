"""Last of the session: `radiance down` on the shared tiny deployment (the modules before it use it)."""
from __future__ import annotations

import json
import os

import httpx
import pytest

from .conftest import radiance

pytestmark = pytest.mark.e2e


def test_zz_down_drains_and_leaves_nothing_running(tiny):
    state = tiny.state()
    engine_pid = int(state["engine_ident"])
    sup_pid = state["supervisor_pid"]
    res = tiny.down()
    assert res.returncode == 0, res.stdout + res.stderr
    for pid in (engine_pid, sup_pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # No process of the engine's group survives (API server, engine core, workers).
    with pytest.raises(ProcessLookupError):
        os.killpg(engine_pid, 0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(tiny.base + "/v1/health/live", timeout=2)
    st = json.loads(radiance("status", tiny.name, "--json", env=tiny.env, check=True).stdout)
    assert st["phase"] == "stopped" and st["ready"] is False
