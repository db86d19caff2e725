"""The patch registry: how radiance changes vLLM, and how it refuses to.

A ``Patch`` names the feature it belongs to, the vLLM attributes it hooks (dotted paths,
checked by presence before anything is touched), the vLLM versions it was written for,
and the process it must run in. ``install()`` either applies the patch or declines it
with one log line; it never raises. Replaced attributes keep the original reachable as
``_orig_<attr>`` on their owner and can be reverted (tests do).

Replacement code is written as ``Hooks``: a class whose methods, named like the vLLM attributes
they replace, are put on the vLLM class by ``Patch.hook``. In them ``self`` is the vLLM object,
``self._orig_<name>(...)`` the original, and the patch (the feature's state) one named attribute.
Two patches' hooks on one attribute chain (the later outside); ``replace`` stays for what is not a
method (a class a module exports, an annotation).

A replacement that raises at run time should be wrapped with ``fail_closed``: the first
exception latches the patch off for the rest of the process and the original runs.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from . import envs
from .versions import SUPPORTED_VLLM

logger = logging.getLogger("radiance")


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def version_in_range(version: str, lo: str, hi: str) -> bool:
    return _version_tuple(lo) <= _version_tuple(version) < _version_tuple(hi)


def resolve(path: str) -> tuple[Any, str, Any]:
    """``"pkg.mod.Class.attr"`` -> (owner, "attr", value). Raises LookupError if absent."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ImportError:
            continue
        except Exception as exc:  # a module that fails to import is a missing hook too
            raise LookupError(f"{module_name} failed to import: {exc}") from exc
        owner = obj
        rest = parts[split:]
        for name in rest[:-1]:
            if not hasattr(owner, name):
                raise LookupError(f"{path}: {'.'.join(parts[:parts.index(name)])} has no {name}")
            owner = getattr(owner, name)
        attr = rest[-1]
        if not hasattr(owner, attr):
            raise LookupError(f"{path}: hook point missing")
        return owner, attr, getattr(owner, attr)
    raise LookupError(f"{path}: no importable module")


_INHERITED = object()
_ADDED = object()  # an attribute the patch put where there was none: reverted by deleting it
# (owner, name) -> the ``via`` of every Hooks stacked on that attribute, innermost first.
_HOOKED: dict[tuple[int, str], list[str]] = {}


def reading_original_as(fn: Callable, name: str, orig_attr: str) -> Callable:
    """``fn`` with its reads of ``self._orig_<name>`` made reads of ``self.<orig_attr>``.

    Why: every Hooks body reaches its original as ``self._orig_<name>``, one attribute of the vLLM class.
    When a second patch hooks the same attribute (w4-drafter and int4-head both convert in
    ``UnquantizedLinearMethod.process_weights_after_loading``; report.engine and dynamic-draft both read
    ``Scheduler.update_from_output``), the outer body must call the inner hook while the inner one still
    calls vLLM's: the outer reads its original under a name of its own. The rename is of the attribute
    name in the function's code (and its nested functions'), so the body runs as written; a name built
    at run time (``getattr(self, "_orig_" + name)``) would not be seen, and no hook does that."""
    old = f"_orig_{name}"

    def renamed(code: types.CodeType) -> types.CodeType:
        return code.replace(
            co_names=tuple(orig_attr if n == old else n for n in code.co_names),
            co_consts=tuple(renamed(c) if isinstance(c, types.CodeType) else c for c in code.co_consts))

    out = types.FunctionType(renamed(fn.__code__), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(out, fn)
    return out


class Hooks:
    """The replacement code for one vLLM class, written as that class's own methods.

    Subclass with ``target`` (the class's dotted path) and ``via`` (the attribute under which the
    patch is reached from the vLLM object), and define methods named like the attributes they
    replace. In their bodies ``self`` is the vLLM object, ``self._orig_<name>(...)`` runs the
    original and ``self.<via>`` is the patch: the feature's state and logic, one explicit object.
    Nothing else is defined here: helpers belong on the patch. ``Patch.hook`` puts them in place,
    ``Patch.revert`` takes them off.
    """

    target: str = ""
    via: str = ""

    @classmethod
    def replacements(cls) -> dict[str, Callable]:
        """Every function defined in the class body, by the name it replaces."""
        return {name: fn for name, fn in vars(cls).items() if inspect.isfunction(fn) and not name.startswith("__")}


@dataclass
class Outcome:
    patch: str
    feature: str
    status: str  # "applied" | "partial" | "declined" | "disabled" | "failed-at-runtime"
    reason: str = ""


class Patch:
    """Subclass per patched vLLM area. Override ``hook_points`` and ``apply``."""

    name: str = ""
    feature: str = ""  # profile feature it belongs to; "" = always on with the plugin
    hook_points: tuple[str, ...] = ()
    vllm_range: tuple[str, str] = SUPPORTED_VLLM

    def __init__(self) -> None:
        self._replaced: list[tuple[Any, str, Any, str | None]] = []
        self._hooked: list[tuple[Any, str, str]] = []  # (owner, attribute, via) this patch's hooks hold
        self.applied = False
        self.latched_off = False
        self.latch_reason = ""

    # -- to override -------------------------------------------------------------------
    @property
    def enable_knob(self) -> str | None:
        """The feature's on/off knob, from the one feature table (None: no such feature, always on with
        the plugin)."""
        from .features import BY_NAME

        feature = BY_NAME.get(self.feature)
        return feature.knob if feature else None

    def enabled(self) -> bool:
        knob = self.enable_knob
        return True if knob is None else bool(envs.get(knob))

    def guard(self) -> str | None:
        """Extra preconditions; return a reason to decline, or None."""
        return None

    def apply(self) -> None:
        raise NotImplementedError

    # -- machinery ---------------------------------------------------------------------
    def replace(self, owner: Any, attr: str, new: Any, orig_attr: str | None = None) -> None:
        """``owner.attr`` = ``new``; the original kept as ``owner.<orig_attr>`` (``_orig_<attr>``)."""
        orig = getattr(owner, attr)
        orig_attr = orig_attr or f"_orig_{attr}"
        # An inherited attribute is restored by deleting ours, not by pinning the parent's on the child.
        own = attr in getattr(owner, "__dict__", {})
        setattr(owner, orig_attr, orig)
        setattr(owner, attr, new)
        self._replaced.append((owner, attr, orig if own else _INHERITED, orig_attr))

    def hook(self, hooks: type[Hooks], owner: Any = None) -> None:
        """Put ``hooks``' methods on ``owner`` (by default the class its ``target`` names), each in place
        of the attribute of its name, and this patch on ``owner`` as ``hooks.via``. Over another patch's
        hooks the new ones chain, outside: their ``self._orig_<name>`` is then the hooks already there
        (``reading_original_as``). The same ``via`` twice on one attribute is refused (raises): it would
        be one patch replacing itself."""
        if owner is None:
            owner = resolve(hooks.target)[2]
        names = hooks.replacements()
        for name in names:
            if hooks.via in _HOOKED.get((id(owner), name), ()):
                raise RuntimeError(f"{getattr(owner, '__name__', owner)}.{name} is replaced already "
                                   f"by {hooks.via}")
        if vars(owner).get(hooks.via) is not self:
            had = hooks.via in vars(owner)
            orig = getattr(owner, hooks.via) if had else _ADDED
            setattr(owner, hooks.via, self)
            self._replaced.append((owner, hooks.via, orig, None))
        for name, fn in names.items():
            stack = _HOOKED.setdefault((id(owner), name), [])
            orig_attr = None
            if stack:
                orig_attr = f"_orig_{name}{hooks.via}"
                fn = reading_original_as(fn, name, orig_attr)
            self.replace(owner, name, fn, orig_attr)
            stack.append(hooks.via)
            self._hooked.append((owner, name, hooks.via))

    def revert(self) -> None:
        for owner, name, via in self._hooked:
            stack = _HOOKED.get((id(owner), name), [])
            if via in stack:
                stack.remove(via)
            if not stack:
                _HOOKED.pop((id(owner), name), None)
        self._hooked.clear()
        for owner, attr, orig, orig_attr in reversed(self._replaced):
            if orig is _INHERITED or orig is _ADDED:
                delattr(owner, attr)
            else:
                setattr(owner, attr, orig)
            if orig_attr is not None:
                try:
                    delattr(owner, orig_attr)
                except AttributeError:
                    pass
        self._replaced.clear()
        self.applied = False

    def check(self, vllm_version: str | None) -> str | None:
        return self.check_static(vllm_version) or self.guard()

    def check_static(self, vllm_version: str | None) -> str | None:
        """Version range and hook points only: what a capability report can know."""
        if vllm_version is None:
            return "vLLM is not importable"
        lo, hi = self.vllm_range
        if not version_in_range(vllm_version, lo, hi):
            return f"vLLM {vllm_version} is outside the supported range [{lo}, {hi})"
        for path in self.hook_points:
            try:
                resolve(path)
            except LookupError as exc:
                return f"hook point {path} missing ({exc})"
        return None

    def on_ranks_disagree(self, model) -> str | None:
        """The TP ranks' outcomes of this patch differ (radiance/report gathers them after the load);
        called on every rank alike. Return what was done to make them agree, or None to leave them
        as they are (reported as ``mixed``): right when a split cannot desynchronise the ranks."""
        return None

    def after_load(self, runner) -> str | None:
        """Called on every TP rank once the worker has loaded the target and any drafter, before the
        ranks' reports are gathered (radiance/report). Return why this applied patch will run stock for
        what was loaded (no drafter, another architecture), to report it declined; None to keep it."""
        return None

    def latch_off(self, reason: str) -> None:
        if not self.latched_off:
            self.latched_off = True
            self.latch_reason = reason
            logger.warning("radiance: %s latched off at run time, stock vLLM from now: %s",
                           self.feature or self.name, reason)
            _REPORT.record(Outcome(self.name, self.feature, "failed-at-runtime", reason))

    def install(self, vllm_version: str | None) -> Outcome:
        if self.applied:
            return Outcome(self.name, self.feature, "applied", "already applied")
        if not self.enabled():
            return Outcome(self.name, self.feature, "disabled")
        reason = self.check(vllm_version)
        if reason is None:
            try:
                self.apply()
            except Exception as exc:  # fail closed: undo whatever was done
                self.revert()
                reason = f"apply raised {type(exc).__name__}: {exc}"
        if reason is not None:
            logger.warning("radiance: declined %s (%s): %s", self.feature or self.name, self.name, reason)
            return Outcome(self.name, self.feature, "declined", reason)
        self.applied = True
        logger.info("radiance: replaced %s for %s", ", ".join(self.hook_points) or self.name,
                    self.feature or self.name)
        return Outcome(self.name, self.feature, "applied")


def fail_closed(patch: Patch, original: Callable) -> Callable:
    """Decorator for a replacement: on its first exception the patch latches off and the
    original runs from then on (for that call too)."""

    def deco(replacement: Callable) -> Callable:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if patch.latched_off:
                return original(*args, **kwargs)
            try:
                return replacement(*args, **kwargs)
            except Exception as exc:
                patch.latch_off(f"{type(exc).__name__}: {exc}")
                return original(*args, **kwargs)

        return wrapper

    return deco


class Report:
    """What this process did, patch by patch. The engine serves it (radiance/report: every TP rank's
    report, gathered after the model load, rides vLLM's scheduler stats to the API server's
    /metrics as ``radiance:patch_status``); ``version`` counts the changes, so the channel resends
    only what is new."""

    def __init__(self) -> None:
        self.outcomes: dict[str, Outcome] = {}
        self.version = 0
        self.listeners: list[Callable[[Outcome], None]] = []
        self._lock = threading.Lock()

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes[outcome.patch] = outcome
            self.version += 1
        for listener in list(self.listeners):
            try:
                listener(outcome)
            except Exception:  # a report must never fail the patch that records
                pass

    def rows(self) -> list[dict]:
        with self._lock:
            return [dict(o.__dict__) for o in self.outcomes.values()]

    def as_dict(self) -> dict:
        return {"pid": os.getpid(), "patches": self.rows()}


_REPORT = Report()


def report() -> Report:
    return _REPORT


@dataclass
class Registry:
    patches: list[Patch] = field(default_factory=list)

    def install_all(self, vllm_version: str | None) -> list[Outcome]:
        outcomes = []
        for patch in self.patches:
            outcome = patch.install(vllm_version)
            if outcome.reason != "already applied":
                _REPORT.record(outcome)
            outcomes.append(outcome)
        return outcomes
