"""Every ``RADIANCE_*`` knob, declared once: name, type, default, doc.

This module imports only the standard library: the launcher reads it too (it is the
contract between the two packages), and it must load before torch or vLLM do. The features'
on/off switches are declared from radiance/features.py's table (standard library too), so a
switch's name is written there alone.

Read a knob with ``envs.get("RADIANCE_DRAFT_TAU")`` or ``envs.RADIANCE_DRAFT_TAU``; both
parse and validate on every call, so a test that sets the environment sees the change.
A bad value raises ``KnobError`` whose message names the variable, the value and the fix.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from . import features

PREFIX = "RADIANCE_"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class KnobError(ValueError):
    """A RADIANCE_* variable holds a value that cannot be used."""


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise KnobError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no, on/off")


def _parse_float(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise KnobError(f"{name}={raw!r}: expected a number, e.g. {name}=0.28") from None


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise KnobError(f"{name}={raw!r}: expected an integer") from None


def _parse_str(name: str, raw: str) -> str:
    return raw


def parse_schedule(name: str, raw: str) -> tuple[tuple[int, int], ...]:
    """``"1:8,2:7,4:6"`` -> ((1, 8), (2, 7), (4, 6)); empty -> () (no cap)."""
    raw = raw.strip()
    if not raw:
        return ()
    pairs = []
    for item in raw.split(","):
        try:
            bs_s, depth_s = item.split(":")
            bs, depth = int(bs_s), int(depth_s)
        except ValueError:
            raise KnobError(
                f"{name}={raw!r}: entry {item!r} is not 'batch_size:max_depth', "
                f"e.g. {name}=1:8,2:7,4:6"
            ) from None
        if bs < 1 or depth < 1:
            raise KnobError(f"{name}={raw!r}: batch sizes and depths must be >= 1 (entry {item!r})")
        pairs.append((bs, depth))
    sizes = [bs for bs, _ in pairs]
    if sizes != sorted(set(sizes)):
        raise KnobError(f"{name}={raw!r}: batch sizes must be strictly increasing")
    return tuple(pairs)


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    parse: Callable[[str, str], Any]
    doc: str
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None  # returns an error text or None
    # Shapes what the engine builds or runs: part of vLLM's compile-cache key (radiance/compile_key.py).
    engine: bool = False

    def read(self, environ: dict[str, str] | None = None) -> Any:
        env = os.environ if environ is None else environ
        raw = env.get(self.name, self.default)
        if self.choices and raw not in self.choices:
            raise KnobError(f"{self.name}={raw!r}: expected one of {', '.join(self.choices)}")
        value = self.parse(self.name, raw)
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise KnobError(f"{self.name}={raw!r}: {problem}")
        return value


def _unit_interval(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must lie in [0, 1]"


def _positive(value: int) -> str | None:
    return None if value > 0 else "must be > 0"


def _non_negative(value: int) -> str | None:
    return None if value >= 0 else "must be >= 0"


def _switch(feature: features.Feature) -> Knob:
    """A feature's on/off knob, from its row in features.py: off unless set; it shapes the engine."""
    return Knob(feature.knob, "0", parse_bool, feature.knob_doc, engine=True)


_KNOBS = (
    # --- plugin-wide -------------------------------------------------------------------
    Knob("RADIANCE_ENABLE", "1", parse_bool,
         "Master switch of the vLLM plugin; 0 leaves vLLM entirely stock."),
    Knob("RADIANCE_LOG_LEVEL", "INFO", _parse_str, "Log level of the radiance logger.",
         choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    Knob("RADIANCE_DEBUG", "0", parse_bool,
         "Show Python tracebacks from the launcher CLI instead of one-line errors."),
    # --- the features' switches (radiance/features.py), then their tuning ---------------
    *(_switch(f) for f in features.FEATURES),
    # --- dynamic-draft -----------------------------------------------------------------
    Knob("RADIANCE_DRAFT_TAU", repr(features.DRAFT_TAU), _parse_float,
         "Never draft a position whose estimated acceptance is below tau (a floor under the measured "
         "choice; 0 leaves the depth to the measurement alone).", check=_unit_interval, engine=True),
    Knob("RADIANCE_DRAFT_SCHEDULE", features.DRAFT_SCHEDULE, parse_schedule,
         "Batch-size schedule 'bs:max_depth,...' capping the draft depth (carry-forward); empty "
         "disables the cap.", engine=True),
    # not an engine knob: every depth's graphs are captured either way, only the choice changes
    Knob("RADIANCE_DRAFT_PIN_DEPTH", "0", _parse_int,
         "Diagnostics: every step at this draft depth (capped at k) through dynamic-draft's own path (vLLM's "
         "per-batch-size lookup, the policy's choice and observation, the counters), to measure that path "
         "against stock at the same depth; 0 leaves the depth to the policy.", check=_non_negative),
    # --- w4-drafter / int4-head: the 4-bit quantiser ----------------------------------
    Knob("RADIANCE_W4_GROUP_SIZE", str(features.W4_GROUP_SIZE), _parse_int,
         "Group size along K of the 4-bit quantiser.", check=_positive, engine=True),
    # --- fp8-stream --------------------------------------------------------------------
    Knob("RADIANCE_FP8_STREAM_FUSED_AR", "1", parse_bool,
         "fp8-stream at TP=2 on GPUs: all-reduce and epilogue as one two-rank kernel over peer "
         "memory (same bits); 0 runs the all-reduce and add_rms_quant separately.", engine=True),
    Knob("RADIANCE_GDN_NORM_QUANT", "0", parse_bool,
         "With the fp8-stream contract installed: GDN gated RMSNorm + fp8 quant in one kernel "
         "feeding out_proj; off by default (1-ulp differences from vLLM's CPU norm, ~3e-6).", engine=True),
    # --- launcher / appliance ----------------------------------------------------------
    Knob("RADIANCE_HOME", "", _parse_str,
         "State directory of the launcher (deployments, logs, reports); empty: "
         "$XDG_STATE_HOME/radiance or ~/.local/state/radiance."),
    Knob("RADIANCE_CACHE_DIR", "", _parse_str,
         "Cache of generated test models and other downloads; empty: "
         "$XDG_CACHE_HOME/radiance or ~/.cache/radiance."),
    Knob("RADIANCE_PROFILE", "profiles/tiny-cpu.yaml", _parse_str,
         "Profile used by compose.yaml and by commands run without a PROFILE argument."),
    Knob("RADIANCE_PORT", "8000", _parse_int, "Public port of the gateway.", check=_positive),
    Knob("RADIANCE_TINY_GSM8K_DIR", "", _parse_str,
         "GSM8K directory whose train questions go into the tiny test model's tokenizer corpus; empty: "
         "../shared/data/gsm8k beside the repository, else a built-in corpus."),
    Knob("RADIANCE_API_KEY", "", _parse_str,
         "The conventional variable for the gateway's API key; a profile names the variable it reads in "
         "server.api_key_env, so the key itself is never written in a profile. Never logged."),
    Knob("RADIANCE_ENGINE_URL", "", _parse_str,
         "`radiance gateway`: where an engine started elsewhere listens: http://host:port or "
         "unix:/path/to/socket (compose's engine service)."),
    Knob("RADIANCE_ENGINE_KEY_FILE", "", _parse_str,
         "A file holding the engine's per-deployment key (vLLM's VLLM_API_KEY): radiance-engine writes a "
         "fresh one at start (mode 0600), `radiance gateway` reads it and sends it upstream. Empty: no key."),
    Knob("RADIANCE_ENGINE_UDS", "", _parse_str,
         "radiance-engine: serve on this Unix socket instead of a TCP port (compose shares it with the "
         "gateway only, through a volume); also what the image's health check probes."),
    Knob("RADIANCE_GATE_URL", "", _parse_str, "`radiance gate`: base URL of the endpoint to gate."),
    Knob("RADIANCE_PLATFORM", "rocm", _parse_str, "compose: which engine image variant to run.",
         choices=("rocm", "cuda", "cpu")),
    Knob("RADIANCE_IMAGE", "", _parse_str, "compose / docker runtime: engine image to run instead of the "
         "computed tag."),
    Knob("RADIANCE_BASE_IMAGE", "", _parse_str, "Base image for image builds (BASE_IMAGE build argument)."),
    Knob("RADIANCE_VERSION", "", _parse_str, "compose: radiance version part of the image tag; empty: "
         "this radiance's version."),
    Knob("RADIANCE_GATE_FORCE_FAIL", "0", parse_bool,
         "Drills and tests: every gate run where this is set fails at once (its checks are not run). "
         "Set on one Ray node (in the environment of its `ray start`) it proves that a replica failing "
         "its gate takes no traffic; it can only hold an endpoint back, never expose one."),
    Knob("RADIANCE_GATE_SPEED_ENFORCE", "0", parse_bool,
         "Tests and drills: the gate's speed check fails below gate.speed.min_ratio on the CPU platform too, "
         "where it otherwise only reports (vLLM's CPU path runs the features' reference kernels)."),
    Knob("RADIANCE_DRAIN_TIMEOUT", "30", _parse_float,
         "Seconds the gateway waits for in-flight requests on shutdown.",
         check=lambda v: None if v >= 0 else "must be >= 0"),
)

KNOBS: dict[str, Knob] = {k.name: k for k in _KNOBS}
ENGINE_KNOBS: tuple[str, ...] = tuple(k.name for k in _KNOBS if k.engine)


def get(name: str, environ: dict[str, str] | None = None) -> Any:
    try:
        knob = KNOBS[name]
    except KeyError:
        raise KeyError(f"{name} is not a declared RADIANCE_* knob (see radiance/envs.py)") from None
    return knob.read(environ)


def validate_all(environ: dict[str, str] | None = None) -> list[str]:
    """Every problem with the RADIANCE_* environment: bad values, and unknown names (warned)."""
    env = os.environ if environ is None else environ
    problems = []
    for knob in _KNOBS:
        try:
            knob.read(env)
        except KnobError as exc:
            problems.append(str(exc))
    return problems


def unknown_names(environ: dict[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    return sorted(n for n in env if n.startswith(PREFIX) and n not in KNOBS)


def warn_unknown(environ: dict[str, str] | None = None) -> None:
    for name in unknown_names(environ):
        warnings.warn(f"{name} is set but is not a RADIANCE_* knob; it is ignored "
                      "(known knobs are listed in radiance/envs.py)", stacklevel=2)


def __getattr__(name: str) -> Any:
    if name in KNOBS:
        return KNOBS[name].read()
    raise AttributeError(name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(KNOBS))
