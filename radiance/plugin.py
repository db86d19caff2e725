"""The vLLM plugin entry point (group ``vllm.general_plugins``).

vLLM calls ``register()`` in every process it starts (API server, engine core, workers),
sometimes more than once per process. The order is: env gate → knob validation → the
quantization configs (QUANT_MODULES) → version guard → lazy import of the patch modules →
install each patch (apply or decline, one log line each). Nothing here may raise into
vLLM: a plugin problem means stock vLLM.
"""
from __future__ import annotations

import importlib
import logging
import sys

from . import envs
from .features import FEATURES
from .patching import Outcome, Patch, Registry, report

logger = logging.getLogger("radiance")

# Quantization configs vLLM must know by name before it validates engine arguments; each
# module registers its config with vLLM's register_quantization_config when imported.
# Registered whenever the plugin is enabled, not only with the feature on: a server that
# quantises with radiance_fp8 and keeps the fp8-stream contract off is the contract's baseline.
QUANT_MODULES: tuple[str, ...] = ("radiance.fp8_stream.linear", "radiance.fp8_stream.w4_linear")

# The report channel (radiance/report): installed whenever the plugin is, features on or off, so every
# engine says what its patches did; the compile-cache key, so no two patch sets share compiled graphs; and
# prompt logprobs the drafter cannot overwrite (vLLM issue 53488), which the gate's target check reads.
CORE_MODULES: tuple[str, ...] = ("radiance.report.patch_worker", "radiance.report.patch_engine",
                                 "radiance.report.patch_server", "radiance.compile_key",
                                 "radiance.runner_prompt_logprobs")

_registry: Registry | None = None


def _setup_logging() -> None:
    if logger.handlers:
        return
    try:
        logger.setLevel(envs.get("RADIANCE_LOG_LEVEL"))
    except envs.KnobError:
        logger.setLevel(logging.INFO)
    # Each line must print once. Where the root logger is configured (some vLLM worker setups, a
    # test's log capture, an operator's config) our records go there; otherwise to our own handler.
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [radiance] %(message)s", "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.propagate = False


def vllm_version() -> str | None:
    try:
        import vllm

        return vllm.__version__
    except Exception:
        return None


def load_patches() -> tuple[list[Patch], list[Outcome]]:
    """Import the patch modules of the enabled features (one module per patched vLLM area, each
    exporting PATCHES; features.FEATURES is the install order); a module that fails declines its
    feature."""
    patches: list[Patch] = []
    declined: list[Outcome] = []
    for module in CORE_MODULES:
        try:
            patches.extend(importlib.import_module(module).PATCHES)
        except Exception as exc:  # without the channel the features still run; the report is local only
            logger.warning("radiance: %s not loaded: %s: %s", module, type(exc).__name__, exc)
    for feat in FEATURES:
        feature, module = feat.name, feat.module
        try:
            enabled = envs.get(feat.knob)
        except envs.KnobError as exc:
            declined.append(Outcome(module, feature, "declined", str(exc)))
            continue
        if not enabled:
            declined.append(Outcome(module, feature, "disabled"))
            continue
        try:
            mod = importlib.import_module(module)
            patches.extend(mod.PATCHES)
        except ModuleNotFoundError as exc:
            reason = "not built in this version of radiance" if exc.name == module else f"import failed: {exc}"
            declined.append(Outcome(module, feature, "declined", reason))
        except Exception as exc:
            declined.append(Outcome(module, feature, "declined", f"import failed: {type(exc).__name__}: {exc}"))
    return patches, declined


def register_quantization() -> None:
    """Import every QUANT_MODULES entry; a failure declines that config only (one log line)."""
    for module in QUANT_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 -- the plugin must never take vLLM down
            logger.warning("radiance: quantization config of %s not registered: %s: %s",
                           module, type(exc).__name__, exc)


def register() -> None:
    global _registry
    _setup_logging()
    try:
        if not envs.get("RADIANCE_ENABLE"):
            logger.info("radiance: plugin disabled by RADIANCE_ENABLE=0; vLLM runs stock")
            return
    except envs.KnobError as exc:
        logger.error("radiance: %s; vLLM runs stock", exc)
        return
    if _registry is not None:
        return  # vLLM loads general plugins more than once per process
    try:
        envs.warn_unknown()
        register_quantization()
        version = vllm_version()
        patches, declined = load_patches()
        for outcome in declined:
            if outcome.status == "declined":
                logger.warning("radiance: declined %s: %s", outcome.feature, outcome.reason)
            report().record(outcome)
        from .report import channel

        if channel.on_local_outcome not in report().listeners:
            report().listeners.append(channel.on_local_outcome)
        _registry = Registry(patches)
        _registry.install_all(version)
    except Exception as exc:  # the plugin must never take vLLM down
        logger.error("radiance: plugin failed (%s: %s); vLLM runs stock", type(exc).__name__, exc)


def registry() -> Registry | None:
    return _registry


def unregister() -> None:
    """Take back every patch ``register`` put in this process, last first, and forget them. vLLM never
    calls it; a process that hosted an engine in-process and goes on with other work does (a test run:
    vLLM's ``LLM`` loads the plugin into the calling process too)."""
    global _registry
    if _registry is None:
        return
    for patch in reversed(_registry.patches):
        patch.revert()
    _registry = None
