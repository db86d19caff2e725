"""What vLLM needs set on a GPU architecture, and the traps known there: one table, each row with its source.

A *default* is a setting the public record says an architecture needs at a tensor-parallel size; the
launcher gives it to every engine on that arch (``launcher.engine_args.build``) unless the profile sets
the same variable or flag itself (the profile wins), or, for an environment variable, the environment
of `radiance up` already has it (as with ``TRITON_CACHE_DIR``). A *trap* is a known failure that no
setting fixes for everyone (the fix costs what most boxes do not need to pay): `radiance check` detects
it from the layout and warns, naming the fix and its source. Profiles do not copy these lines; a
profile's comment points here.

Rows are keyed by an arch prefix of ``normalize_arch`` ("gfx12": gfx1200, gfx1201, RDNA4), so a
sibling of the measured card inherits its row; a row that only one chip needs names that chip.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .arch import normalize_arch

Kind = Literal["env", "vllm_arg"]
# Who decides the value the engine gets: the table, the profile (env / vllm_args), or the environment
# of the launcher (env only).
Decider = Literal["default", "profile", "environment"]


@dataclass(frozen=True)
class ArchDefault:
    arch: str  # prefix of the normalised arch name: "gfx12" matches gfx1200 and gfx1201
    kind: Kind
    name: str  # an environment variable, or a vLLM flag without dashes (as in a profile's vllm_args)
    value: str | bool
    min_tp: int  # applies from this parallel.tp on
    why: str
    source: str

    def matches(self, arch: str, tp: int) -> bool:
        return normalize_arch(arch).startswith(self.arch) and tp >= self.min_tp

    def setting(self, value: str | bool | None = None) -> str:
        v = self.value if value is None else value
        if self.kind == "env":
            return f"{self.name}={v}"
        return f"vllm_args {self.name}: {str(v).lower() if isinstance(v, bool) else v}"


@dataclass(frozen=True)
class ArchTrap:
    arch: str
    name: str  # a short handle for the row and the JSON
    min_gpus: int  # detected when the engine spans this many GPUs of the arch (tp x pp)
    avoided_by: tuple[str, str]  # (environment variable, value) that sidesteps it
    why: str
    source: str

    def matches(self, arch: str, gpus: int) -> bool:
        return normalize_arch(arch).startswith(self.arch) and gpus >= self.min_gpus


DEFAULTS: tuple[ArchDefault, ...] = (
    ArchDefault(
        "gfx12", "env", "NCCL_PROTO", "Simple", 2,
        why="RCCL's LL protocol deadlocks tensor parallelism on gfx12",
        source="vLLM issue 40980 (root cause ROCm/rocm-systems issue 5480)"),
    ArchDefault(
        "gfx12", "vllm_arg", "disable-custom-all-reduce", True, 2,
        why="vLLM's custom all-reduce is disabled on Navi; a 2x R9700 report over PCIe got wrong sums from it",
        source="ROCm/vllm issue 287"),
    ArchDefault(
        "gfx12", "env", "VLLM_ROCM_USE_AITER", "0", 1,  # kernels, not collectives: any tp
        why="gfx1201 is missing from AITER's arch table, so its FP8 paths fall back to FP32",
        source="ROCm/TransformerEngine issue 520"),
)

TRAPS: tuple[ArchTrap, ...] = (
    ArchTrap(
        "gfx12", "pcie-p2p", 4, ("NCCL_P2P_DISABLE", "1"),
        why="direct PCIe peer-to-peer between 4 or more gfx1201 cards during tensor-parallel inference "
            "hangs the host (llama.cpp and vLLM alike); turning it off costs the 2-card box its P2P "
            "bandwidth, so it is a trap detected here, not a default",
        source="ROCm/rocm-systems issue 11348"),
)


@dataclass(frozen=True)
class Resolved:
    """A default as one engine gets it: the value, and who decided it."""

    default: ArchDefault
    decided_by: Decider
    value: str | bool

    def describe(self) -> str:
        d = self.default
        if self.decided_by == "default":
            head = f"{d.setting()} (arch default)"
        else:
            head = f"{d.setting(self.value)} ({self.decided_by} setting wins; the arch default is {d.setting()})"
        return f"{head}: {d.why} — source: {d.source}"

    def to_dict(self) -> dict:
        d = self.default
        return {"arch": d.arch, "kind": d.kind, "name": d.name, "value": self.value, "default": d.value,
                "decided_by": self.decided_by, "min_tp": d.min_tp, "why": d.why, "source": d.source}


@dataclass(frozen=True)
class Detected:
    trap: ArchTrap
    avoided: bool  # the environment (profile or launcher's) already sets the trap's fix

    def describe(self) -> str:
        t, (var, val) = self.trap, self.trap.avoided_by
        if self.avoided:
            return f"avoided ({var}={val} is set): {t.why} — source: {t.source}"
        return f"{t.why} — fix: set env {var}: \"{val}\" in the profile — source: {t.source}"

    def to_dict(self) -> dict:
        t = self.trap
        return {"arch": t.arch, "name": t.name, "min_gpus": t.min_gpus, "avoided": self.avoided,
                "fix": f"{t.avoided_by[0]}={t.avoided_by[1]}", "why": t.why, "source": t.source}


def defaults_for(arch: str, tp: int) -> list[ArchDefault]:
    """The table's rows for ``arch`` at this tensor-parallel size."""
    return [d for d in DEFAULTS if d.matches(arch, tp)]


def resolve(arch: str, tp: int, env: Mapping[str, str], vllm_args: Mapping[str, object],
            environ: Mapping[str, str] | None = None) -> list[Resolved]:
    """Each of ``arch``'s defaults at ``tp`` with the value the engine gets: the profile's ``env`` or
    ``vllm_args`` when it sets the name (``no-NAME`` counts), else the launcher's ``environ`` for an
    environment variable, else the table's."""
    environ = {} if environ is None else environ
    out = []
    for d in defaults_for(arch, tp):
        if d.kind == "env" and d.name in env:
            out.append(Resolved(d, "profile", env[d.name]))
        elif d.kind == "env" and d.name in environ:
            out.append(Resolved(d, "environment", environ[d.name]))
        elif d.kind == "vllm_arg" and d.name in vllm_args:
            out.append(Resolved(d, "profile", vllm_args[d.name]))  # type: ignore[arg-type]
        elif d.kind == "vllm_arg" and f"no-{d.name}" in vllm_args:
            out.append(Resolved(d, "profile", not vllm_args[f"no-{d.name}"]))
        else:
            out.append(Resolved(d, "default", d.value))
    return out


def to_apply(resolved: list[Resolved]) -> tuple[dict[str, str], dict[str, str | bool]]:
    """(environment, vllm_args) the table adds: the rows nobody else decided."""
    env: dict[str, str] = {}
    args: dict[str, str | bool] = {}
    for r in resolved:
        if r.decided_by != "default":
            continue
        if r.default.kind == "env":
            env[r.default.name] = str(r.value)
        else:
            args[r.default.name] = r.value
    return env, args


def detect_traps(arch: str, gpus: int, env: Mapping[str, str],
                 environ: Mapping[str, str] | None = None) -> list[Detected]:
    """The known traps an engine on ``gpus`` GPUs of ``arch`` walks into, each marked avoided when the
    profile's ``env`` (or else the launcher's ``environ``) sets its fix."""
    environ = {} if environ is None else environ
    out = []
    for t in TRAPS:
        if not t.matches(arch, gpus):
            continue
        var, val = t.avoided_by
        have = env.get(var, environ.get(var))
        out.append(Detected(t, avoided=have == val))
    return out
