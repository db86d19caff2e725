"""The profile: one YAML file that says what to serve and how, validated before anything runs.

Unknown keys are rejected, cross-field rules carry their reason, and every error is turned
into one line ``FILE:LINE: FIELD: problem — fix``.
"""
from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MantissaNoDotYAML1_1Warning

from radiance import envs, features

from . import platforms
from .gate.config import GateConfig

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BUILTIN_PREFIX = "builtin:"
# The tiny test models (tools.tinymodel): random weights generated on first use, or the trained
# ones committed under models/.
BUILTIN_MODELS = ("tiny-qwen3next", "tiny-qwen3next-trained", "tiny-qwen3.5", "tiny-qwen3.5-trained",
                  # Qwen3.5-27B's config.json without weights (models/qwen3.5-27b-shape): load-format dummy
                  "qwen3.5-27b-shape")
# The trained tiny DFlash drafter of the trained tiny Qwen3.5, committed under models/ (tiny profiles).
BUILTIN_DRAFTERS = ("tiny-qwen3.5-dflash",)


class ProfileError(Exception):
    """A profile that cannot be used; ``lines`` are complete one-line messages."""

    def __init__(self, lines: list[str]):
        super().__init__(lines[0] if lines else "invalid profile")
        self.lines = lines


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelSpec(_Strict):
    path: str = Field(description="local directory, hub id (org/name) or builtin:<name>")
    # The checkpoint's architecture (config.json "architectures"), for `radiance check` to say which
    # features apply before the model is on this machine; config.json wins when it is local.
    architecture: Optional[str] = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    revision: Optional[str] = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: Optional[int] = Field(default=None, ge=16)
    served_name: Optional[str] = None
    # fp8: vLLM's own fp8 method. radiance_fp8: the linears fp8_stream feeds -- online W8A8 for a bf16
    # checkpoint (weights per channel at load, activations per token), or a block-fp8 (128x128)
    # checkpoint's weights as stored (activations per group of 128). radiance_w4: the same consumers in
    # 4 bits (W4A8 on the epilogue's fp8, W4A16 on a tensor), quantised at load from a bf16 or block-fp8
    # checkpoint, or a symmetric group-128 GPTQ one repacked.
    quantization: Optional[Literal["fp8", "radiance_fp8", "radiance_w4"]] = None
    fp8_lm_head: bool = False
    trust_remote_code: bool = False

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty — fix: a local directory, a hub id or builtin:tiny-qwen3.5-trained")
        if v.startswith(BUILTIN_PREFIX) and v[len(BUILTIN_PREFIX):] not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model {v!r} — fix: one of "
                             + ", ".join(BUILTIN_PREFIX + m for m in BUILTIN_MODELS))
        return v


class Parallel(_Strict):
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)


class Drafter(_Strict):
    type: Literal["none", "mtp", "dflash", "ngram"] = "none"
    model: Optional[str] = None
    num_speculative_tokens: int = Field(default=2, ge=1, le=16)
    # ngram only
    prompt_lookup_max: Optional[int] = Field(default=None, ge=1)
    prompt_lookup_min: Optional[int] = Field(default=None, ge=1)

    @field_validator("model")
    @classmethod
    def _builtin(cls, v: Optional[str]) -> Optional[str]:
        if v and v.startswith(BUILTIN_PREFIX) and v[len(BUILTIN_PREFIX):] not in BUILTIN_DRAFTERS:
            raise ValueError(f"unknown builtin drafter {v!r} — fix: one of "
                             + ", ".join(BUILTIN_PREFIX + m for m in BUILTIN_DRAFTERS))
        return v

    @model_validator(mode="after")
    def _needs_model(self) -> "Drafter":
        if self.type == "dflash" and not self.model:
            raise ValueError("drafter.type dflash needs drafter.model — fix: set drafter.model to the "
                             "DFlash drafter's path or hub id")
        if self.type in ("mtp", "none", "ngram") and self.model:
            raise ValueError(f"drafter.model is only used by dflash, not {self.type} — fix: remove drafter.model")
        return self


class DynamicDraft(_Strict):
    enabled: bool = False
    tau: float = Field(default=features.DRAFT_TAU, ge=0.0, le=1.0)
    schedule: str = features.DRAFT_SCHEDULE

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        # The knob's own parser: the profile and RADIANCE_DRAFT_SCHEDULE accept exactly the same strings.
        try:
            pairs = envs.parse_schedule("schedule", v)
        except envs.KnobError as exc:
            raise ValueError(f"{exc} — fix: e.g. \"1:8,2:7,4:6\"") from None
        return ",".join(f"{bs}:{depth}" for bs, depth in pairs)


class Toggle(_Strict):
    enabled: bool = False


class Fp8Stream(Toggle):
    # The GDN gated-norm + fp8 quant epilogue (RADIANCE_GDN_NORM_QUANT). Off by default: it rounds
    # 1 in ~300 000 values an ulp away from vLLM's own norm.
    gdn_norm_quant: bool = False

    @model_validator(mode="after")
    def _needs_stream(self) -> "Fp8Stream":
        if self.gdn_norm_quant and not self.enabled:
            raise ValueError("gdn_norm_quant works inside the fp8-stream contract — fix: set "
                             "fp8_stream.enabled: true or drop gdn_norm_quant")
        return self


def _bool_shorthand(v: Any) -> Any:
    return {"enabled": v} if isinstance(v, bool) else v


class Features(_Strict):
    dynamic_draft: DynamicDraft = DynamicDraft()
    w4_drafter: Toggle = Toggle()
    fp8_stream: Fp8Stream = Fp8Stream()
    int4_head: Toggle = Toggle()

    _shorthand = field_validator(*features.NAMES, mode="before")(classmethod(lambda cls, v: _bool_shorthand(v)))

    def enabled_names(self) -> list[str]:
        return [n for n in features.NAMES if getattr(self, n).enabled]


class Runtime(_Strict):
    # launcher/runtime/__init__.py names each kind's module; `radiance up --runtime` overrides this.
    kind: Literal["local", "docker", "ray"] = "local"
    platform: Literal[platforms.WANTED] = platforms.AUTO  # type: ignore[valid-type]
    image: Optional[str] = None
    startup_timeout_s: float = Field(default=900.0, gt=0)
    # kind ray: how many gated replicas Serve runs, and the cluster to join (host:port of its GCS, or
    # ray://host:10001; unset: RAY_ADDRESS, else a local cluster of the deployment's own).
    replicas: int = Field(default=1, ge=1)
    address: Optional[str] = None

    @field_validator("address")
    @classmethod
    def _address(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.strip():
            raise ValueError("is empty — fix: the Ray cluster's address (host:port of its GCS, or "
                             "ray://host:10001), or remove it")
        return v

    @model_validator(mode="after")
    def _ray_only(self) -> "Runtime":
        for name, given in (("replicas", self.replicas != 1), ("address", self.address is not None)):
            if given and self.kind != "ray":
                raise _Rule(f"runtime.{name}", f"is for runtime.kind ray (kind is {self.kind!r}) — fix: set "
                            f"runtime.kind: ray or remove runtime.{name}")
        return self


class Server(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    api_key_env: Optional[str] = None

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not ENV_NAME.match(v):
            raise ValueError(f"{v!r} is not an environment variable name — fix: the NAME of the "
                             "variable that holds the key (e.g. RADIANCE_API_KEY), never the key")
        return v


class Profile(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    description: str = ""
    model: ModelSpec
    parallel: Parallel = Parallel()
    drafter: Drafter = Drafter()
    features: Features = Features()
    runtime: Runtime = Runtime()
    server: Server = Server()
    gate: GateConfig = GateConfig()
    vllm_args: dict[str, Union[str, int, float, bool, None]] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("vllm_args")
    @classmethod
    def _vllm_args(cls, v: dict) -> dict:
        for key in v:
            if key.startswith("-") or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key):
                raise ValueError(f"{key!r} — fix: write flags without dashes, e.g. enforce-eager: true")
            if key in ("uds", "ssl-keyfile", "ssl-certfile", "root-path"):
                raise ValueError(f"{key!r} would change how the gateway reaches the engine (its private "
                                 "socket) — fix: remove it; TLS and paths belong in front of the gateway")
            if key in _MANAGED_FLAGS:
                raise ValueError(f"{key!r} is set from the profile itself — fix: use {_MANAGED_FLAGS[key]}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict) -> dict:
        for key in v:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key.startswith("RADIANCE_"):
                raise ValueError(f"{key} is set from the profile's features — fix: remove it from env")
            if _looks_secret(key):
                raise ValueError(f"{key} looks like a secret and must not be written in a profile — fix: "
                                 "export it in the environment of `radiance up`; it is passed through")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "Profile":
        f, d, p = self.features, self.drafter, self.parallel
        # Each feature's setup rule is written in radiance/features.py; `radiance check` reads the same one.
        setup = features.Setup(tp=p.tp, pp=p.pp, drafter=d.type, quantization=self.model.quantization,
                               fp8_lm_head=self.model.fp8_lm_head)
        for feat in features.FEATURES:
            problem = getattr(f, feat.name).enabled and features.setup_refusal(feat.name, setup)
            if problem:
                raise _Rule(f"features.{feat.name}", problem)
        # A target-side feature changes the target's numerics; acceptance cannot see that (a damaged head the
        # drafter shares keeps it), so the target check judges it, greedy agreement included (issue 38).
        target_side = [feat.name for feat in features.FEATURES
                       if feat.side == "target" and getattr(f, feat.name).enabled]
        if target_side and self.gate.target.enabled and self.gate.target.min_prefix_agreement is None:
            raise _Rule("gate.target", f"{', '.join(target_side)} changes the target's numerics, so greedy "
                        "agreement with stock must be checked — fix: set gate.target.min_prefix_agreement (the "
                        "shipped profiles use 0.2: profiles/tiny-cpu.yaml says why)")
        if self.gate.acceptance.enabled and d.type == "none" and _acceptance_thresholds_set(self.gate):
            raise _Rule("gate.acceptance", "acceptance thresholds need a drafter — fix: set drafter.type or "
                        "remove the acceptance thresholds")
        return self

    # -- derived -----------------------------------------------------------------------
    def served_name(self) -> str:
        return self.model.served_name or self.name

    def fingerprint(self) -> str:
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_MANAGED_FLAGS = {
    "model": "model.path", "tensor-parallel-size": "parallel.tp", "pipeline-parallel-size": "parallel.pp",
    "speculative-config": "drafter", "port": "server.port", "host": "server.host",
    "served-model-name": "model.served_name", "dtype": "model.dtype", "max-model-len": "model.max_model_len",
    "api-key": "server.api_key_env",
}
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "APIKEY")


def _looks_secret(name: str) -> bool:
    return any(w in name.upper() for w in _SECRET_WORDS)


def _acceptance_thresholds_set(gate: GateConfig) -> bool:
    a = gate.acceptance
    return any(x is not None for x in (a.min_mean_acceptance_length, a.min_acceptance_rate, a.min_per_position))


class _Rule(ValueError):
    """A cross-field rule; carries the field it is about (pydantic wraps it as a model error)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"@{field}@ {message}")


# --------------------------------------------------------------------------------------
# Loading: YAML parsed once by ruamel.yaml, which keeps each key's position; pydantic errors turned into
# one line each.

def _yaml() -> YAML:
    # Round-trip mode: mappings and sequences carry their line and column (``.lc``). YAML 1.1, as
    # PyYAML read profiles before: yes/no/on/off stay booleans, 010 octal.
    y = YAML(typ="rt", pure=True)
    y.version = (1, 1)
    y.allow_duplicate_keys = False
    return y


def line_of(path: str | Path, loc: tuple) -> int | None:
    """The line of ``loc`` (keys and indexes) in the profile at ``path``, for errors found after loading."""
    try:
        return _line(_yaml().load(Path(path).read_text()), loc)
    except Exception:  # the file was readable a moment ago; a line number is a courtesy
        return None


def _line(root: Any, loc: tuple) -> int | None:
    """Line (1-based) of the deepest key or item in ``loc`` that the document has."""
    node, line = root, (root.lc.line + 1 if isinstance(root, (CommentedMap, CommentedSeq)) else None)
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
        else:
            return line
        node = node[part]
    return line


_FIXES = {
    "extra_forbidden": "remove it (see profiles/README.md for the keys allowed here)",
    "missing": "add it",
    "int_parsing": "write a whole number",
    "int_type": "write a whole number",
    "float_parsing": "write a number",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
    "string_type": "write a string",
    "dict_type": "write a mapping (key: value lines)",
    "model_type": "write a mapping (key: value lines)",
    "literal_error": "use one of the values listed",
}


def _format_error(path: str, root, err: dict) -> str:
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    m = re.match(r"@([\w.]+)@ (.*)", msg, re.S)
    if m:  # cross-field rule: it names its own field
        loc = tuple(m.group(1).split("."))
        msg = m.group(2)
    field = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "greater_than_equal":
        msg = f"must be >= {err['ctx']['ge']}, got {err.get('input')!r}"
    elif err["type"] == "less_than_equal":
        msg = f"must be <= {err['ctx']['le']}, got {err.get('input')!r}"
    fix = _FIXES.get(err["type"])
    if err["type"] in ("greater_than_equal", "less_than_equal"):
        fix = "change the value to lie in range"
    line = _line(root, loc)
    where = f"{path}:{line}" if line else path
    text = f"{where}: {field}: {msg}"
    if fix and "fix:" not in msg:
        text += f" — fix: {fix}"
    return " ".join(text.split())


def parse_profile(text: str, path: str = "<profile>") -> Profile:
    try:
        with warnings.catch_warnings():  # 1e-3 without a dot: a number, as YAML 1.2 and JSON say
            warnings.simplefilter("ignore", MantissaNoDotYAML1_1Warning)
            data = _yaml().load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError([f"{where}: (yaml): {problem} — fix: correct the YAML syntax "
                            "(indentation, colons, quotes)"]) from None
    if data is None:
        raise ProfileError([f"{path}:1: (top level): the profile is empty — fix: start from profiles/tiny-cpu.yaml"])
    if not isinstance(data, dict):
        raise ProfileError([f"{path}:1: (top level): expected a mapping of keys, got "
                            f"{'a list' if isinstance(data, list) else type(data).__name__} — fix: start from profiles/tiny-cpu.yaml"])
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError([_format_error(path, data, e) for e in _one_per_value(exc.errors())]) from None


def _one_per_value(errs: list[dict]) -> list[dict]:
    """A vllm_args value of none of its types (a list, a mapping) fails each member of the union: one
    error for it, not one per type."""
    out, seen = [], set()
    for e in errs:
        loc = e["loc"]
        if len(loc) == 3 and loc[0] == "vllm_args":
            if loc[:2] in seen:
                continue
            seen.add(loc[:2])
            kind = ("a list" if isinstance(e.get("input"), list) else "a mapping" if isinstance(e.get("input"), dict)
                    else type(e.get("input")).__name__)
            e = {**e, "loc": loc[:2], "type": "vllm_arg_type",
                 "msg": f"must be a string, a number, true/false or null, got {kind} — fix: one value; JSON "
                        "for vLLM (hf-overrides, compilation-config) goes quoted, as text"}
        out.append(e)
    return out


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ProfileError([f"{p}: file not found — fix: give the path of a profile, e.g. "
                            "profiles/tiny-cpu.yaml"]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ProfileError([f"{p}: cannot read ({exc.__class__.__name__}) — fix: give a readable YAML file"]) from None
    return parse_profile(text, str(p))
