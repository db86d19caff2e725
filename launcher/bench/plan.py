"""Which engines `radiance bench` starts: the profile's model with named feature sets.

A set is written as one word: ``stock`` (the plugin off: vLLM as released), ``all`` (the features the
profile turns on), ``no-FEATURE`` (all of them but one), ``only-FEATURE``, or ``a+b`` (exactly these).
A suffix ``@v1`` / ``@v2`` picks vLLM's model runner; without one a set runs on the runner `radiance up`
would give it (engine_args.model_runner): V1 on a CPU, vLLM's default V2 on a GPU unless the profile's env says
otherwise, so ``stock`` on a GPU is what `vllm serve` gives a user and ``stock@v1`` the like-for-like
reference of a V1 set. A last suffix ``/kN`` runs the set with N draft
tokens instead of the profile's ``drafter.num_speculative_tokens`` (``stock/k2``: the best fixed depth is
found by measuring each).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from radiance.features import NAMES

from .. import platforms
from ..engine_args import model_runner
from ..errors import UsageError
from ..profile import Profile

RUNNERS = ("v1", "v2")


@dataclass(frozen=True)
class FeatureSet:
    name: str
    features: tuple[str, ...]      # on, in the feature table's order
    plugin: bool                   # False: RADIANCE_ENABLE=0, vLLM runs as released
    runner: str                    # "v1" | "v2"
    depth: int | None = None       # num_speculative_tokens instead of the profile's


def _ordered(names: set[str]) -> tuple[str, ...]:
    return tuple(n for n in NAMES if n in names)


def _feature(word: str, name: str, spec: str) -> str:
    if name not in NAMES:
        raise UsageError(f"--sets {spec}: {word!r} names no feature — fix: one of {', '.join(NAMES)}")
    return name


def _depth(word: str, text: str, spec: str) -> int:
    if not (text.startswith("k") and text[1:].isdigit() and 1 <= int(text[1:]) <= 16):
        raise UsageError(f"--sets {spec}: {word!r}: depth {text!r} — fix: /k1 ... /k16 (draft tokens)")
    return int(text[1:])


def parse_one(word: str, profile: Profile, platform: str, spec: str) -> FeatureSet:
    enabled = tuple(profile.features.enabled_names())
    head, slash, depth_text = word.partition("/")
    depth = _depth(word, depth_text, spec) if slash else None
    base, _, runner = head.partition("@")
    if runner and runner not in RUNNERS:
        raise UsageError(f"--sets {spec}: {word!r}: runner {runner!r} — fix: @v1 or @v2")
    if base == "stock":
        on: set[str] = set()
    elif base == "all":
        on = set(enabled)
    elif base.startswith("no-"):
        name = _feature(word, base[3:], spec)
        if name not in enabled:
            raise UsageError(f"--sets {spec}: {word!r}: {name} is not on in this profile — fix: drop it "
                             "or turn it on under features:")
        on = set(enabled) - {name}
    elif base.startswith("only-"):
        on = {_feature(word, base[5:], spec)}
    else:
        on = {_feature(word, n, spec) for n in base.split("+") if n}
    if not runner:
        runner = default_runner(profile, platform)
    if platform == platforms.CPU.name and runner == "v2":
        raise UsageError(f"--sets {spec}: {word!r}: Model Runner V2 needs Triton, which vLLM's CPU build "
                         "lacks — fix: drop @v2 on a CPU")
    return FeatureSet(name=word, features=_ordered(on), plugin=base != "stock", runner=runner, depth=depth)


def default_runner(profile: Profile, platform: str) -> str:
    """The runner `radiance up` gives an engine of this profile on ``platform``, whatever its features."""
    return model_runner(platform, profile.env, dict(os.environ))


def default_sets(profile: Profile, platform: str) -> str:
    """stock, all, and each enabled feature off in turn (every set on the runner `radiance up` gives)."""
    enabled = profile.features.enabled_names()
    words = ["stock", "all"]
    if len(enabled) > 1:
        words += [f"no-{n}" for n in enabled]
    return ",".join(words)


def parse(spec: str, profile: Profile, platform: str) -> list[FeatureSet]:
    words = [w.strip() for w in spec.split(",") if w.strip()]
    if not words:
        raise UsageError("--sets is empty — fix: e.g. --sets stock,all")
    sets = [parse_one(w, profile, platform, spec) for w in words]
    seen: set[str] = set()
    for s in sets:
        if s.name in seen:
            raise UsageError(f"--sets {spec}: {s.name!r} twice — fix: name each set once")
        seen.add(s.name)
    return sets


def engine_env(pairs: list[tuple[str, str]], sets: list[FeatureSet]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """``--engine-env`` items as (every engine's, each set's): a key ``SET:NAME`` is that set's alone (a
    diagnostic knob beside the same set without it: ``dynamic_draft:RADIANCE_DRAFT_PIN_DEPTH=4`` next to
    ``only-dynamic_draft``). ValueError names a set that is not measured."""
    names = [s.name for s in sets]
    common: dict[str, str] = {}
    per_set: dict[str, dict[str, str]] = {}
    for key, value in pairs:
        set_name, colon, name = key.rpartition(":")
        if not colon:
            common[key] = value
            continue
        if not name:
            raise ValueError(f"{key}={value!r}: no variable name after {set_name}: — fix: SET:NAME=VALUE")
        if set_name not in names:
            raise ValueError(f"{key}={value!r}: {set_name!r} is not one of the sets measured ({', '.join(names)}) "
                             "— fix: SET:NAME=VALUE with SET as written in --sets")
        per_set.setdefault(set_name, {})[name] = value
    return common, per_set


def for_set(profile: Profile, fs: FeatureSet) -> Profile:
    """The profile as the set runs it: its features, and its draft depth where the set names one."""
    p = with_features(profile, fs.features)
    if fs.depth is None:
        return p
    if p.drafter.type == "none":
        raise UsageError(f"--sets: {fs.name!r} names a draft depth, but the profile has no drafter — fix: drop "
                         f"/k{fs.depth}")
    return p.model_copy(update={"drafter": p.drafter.model_copy(update={"num_speculative_tokens": fs.depth})})


def with_features(profile: Profile, on: tuple[str, ...]) -> Profile:
    """The profile with exactly these features on (their settings as the profile has them)."""
    f = profile.features
    update = {}
    for name in NAMES:
        section = getattr(f, name)
        changes = {"enabled": name in on}
        if name == "fp8_stream" and name not in on:
            changes["gdn_norm_quant"] = False  # lives inside the stream
        update[name] = section.model_copy(update=changes)
    return profile.model_copy(update={"features": f.model_copy(update=update)})
