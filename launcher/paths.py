"""Where the launcher keeps state and caches (per user), and where the repo's data lives."""
from __future__ import annotations

import os
from pathlib import Path

from radiance import envs

REPO_ROOT = Path(__file__).resolve().parent.parent


def state_home() -> Path:
    configured = envs.get("RADIANCE_HOME")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "radiance"


def cache_home() -> Path:
    configured = envs.get("RADIANCE_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "radiance"


def deployment_dir(name: str) -> Path:
    return state_home() / "deployments" / name


def reports_dir() -> Path:
    return state_home() / "reports"
