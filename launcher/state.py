"""Per-deployment state on disk: what `status`, `logs` and `down` read."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import paths, procs


def engine_stop_timeout(drain_s: float) -> float:
    """How long the supervisor gives the engine to exit once the drain is over: the drain's budget again,
    at least 10 s. `radiance down` waits this out too, so the rule lives beside the state they share."""
    return max(drain_s, 10.0)


@dataclass
class DeploymentState:
    name: str
    profile_path: str
    profile_hash: str
    runtime: str                      # local | docker | external | ray
    gateway_url: str
    engine_url: str
    supervisor_pid: int
    supervisor_started: int | None = None   # its start time (launcher.procs): a recycled pid is not it
    engine_ident: str = ""            # pid or container id
    phase: str = "starting"
    ready: bool = False
    reason: str = ""
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    engine_log: str = ""
    supervisor_log: str = ""
    gate_report: str = ""
    exit_code: int | None = None
    api_key_env: str | None = None
    ray_address: str = ""             # runtime ray: the cluster the replicas run on
    replicas: int = 0                 # runtime ray: how many were asked for
    drain_timeout_s: float | None = None   # the supervisor's drain budget: `radiance down` waits it out

    @property
    def dir(self) -> Path:
        return paths.deployment_dir(self.name)

    def save(self) -> None:
        self.updated_at = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.dir / "state.json")

    @classmethod
    def load(cls, name: str) -> "DeploymentState | None":
        f = paths.deployment_dir(name) / "state.json"
        try:
            data = json.loads(f.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def supervisor_alive(self) -> bool:
        """Running, not a zombie, and the very process that wrote this state."""
        return procs.alive(self.supervisor_pid, self.supervisor_started)


def all_deployments() -> list[DeploymentState]:
    root = paths.state_home() / "deployments"
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        st = DeploymentState.load(d.name)
        if st is not None:
            out.append(st)
    return out
