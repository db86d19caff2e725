"""The four features, described once: profile field, knob, patch module, kernels, and when each applies.

Standard library only: the launcher reads this module (like ``envs.py``) to write the engine's
``RADIANCE_*`` environment and to explain a profile in ``radiance check`` before any engine or
image exists; the plugin reads it to know which patch module serves which knob.

``applicability(name, facts, setup)`` predicts, from a checkpoint's config.json (or only the
architecture a profile declares) and the serving setup, whether a feature will apply and why
not. It restates the patches' install-time guards statically; the patches still check for
themselves at load (and decline in one log line) -- this is what a user reads first. The part of
each rule that reads only the serving setup (drafter, tp/pp, an fp8 head) is also what a profile is
validated against (``setup_refusal``): the rule is written here once, for both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Feature:
    name: str          # the key under a profile's ``features:``
    knob: str          # RADIANCE_* on/off switch; envs.py declares it from this row (off by default)
    module: str        # the patch module (exports PATCHES)
    kernels: str       # AotSpec.feature tag of the Triton kernels it runs
    side: str          # "draft": lossless by construction; "target": changes numerics, the gate decides
    summary: str
    knob_doc: str      # the switch's line in envs.py's table


FEATURES: tuple[Feature, ...] = (  # the install order
    Feature("dynamic_draft", "RADIANCE_DYNAMIC_DRAFT", "radiance.draft.patch_scheduler", "", "draft",
            "MTP draft depth chosen per step by vLLM's scheduler from measured acceptance and step time",
            "Per-step MTP draft depth chosen in vLLM's scheduler; 0 is vLLM's configured depth."),
    Feature("w4_drafter", "RADIANCE_W4_DRAFTER", "radiance.w4.patch_drafter", "w4", "draft",
            "the drafter's linears as W4A16",
            "Quantise the drafter's linears to 4-bit (W4A16) at load; lossless for the target."),
    Feature("int4_head", "RADIANCE_INT4_HEAD", "radiance.lmhead_int4.patch", "w4", "target",
            "the target's lm_head as W4A16",
            "Quantise the target's lm_head to 4-bit (W4A16) after load; changes numerics."),
    Feature("fp8_stream", "RADIANCE_FP8_STREAM", "radiance.fp8_stream.patch", "fp8_stream", "target",
            "fp8 residual stream: all-reduce + residual add + RMSNorm + fp8 quant in one epilogue (TP>1)",
            "fp8 residual-stream contract with fused add + RMSNorm + quant epilogues (TP>1)."),
)
BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURES}
NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)

# Defaults a profile and the knobs share (the knob defaults in envs.py are these values).
# A floor, not the choice: the policy drafts as deep as the measured tokens per second say; a position
# accepted less than one time in ten is not drafted at all (its gain, 0.1 token, pays for no forward
# measured here). The seeds' 0.28 was a bound on a running product of confidences, a different quantity.
DRAFT_TAU = 0.1
DRAFT_SCHEDULE = "1:8,2:7,4:6,8:5,16:4"
W4_GROUP_SIZE = 128


def draft_depth_tiers(k: int) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` that names every draft depth 1..k once (at batch size
    d, depth d; the tail carries k), so that Model Runner V2 captures full graphs for each. dynamic-draft
    chooses among them; the batch sizes mean nothing then. The launcher writes it, the patch recognises it."""
    return [[d, d, d] for d in range(1, k + 1)]


# ---------------------------------------------------------------------------------------------
# Static applicability
# ---------------------------------------------------------------------------------------------

# Architectures of the family by name, for a profile whose checkpoint is not on this machine.
DENSE_ARCHS = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
MOE_ARCHS = ("Qwen3NextForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")


@dataclass
class ModelFacts:
    """What the rules need to know about a checkpoint; None where it is not known."""
    architecture: str | None = None
    source: str = "unknown"              # "config.json" | "profile" | "unknown"
    moe: bool | None = None              # sparse-MoE MLPs (Qwen3-Next, Qwen3.5-MoE)
    mtp_layers: int | None = None
    tied_head: bool | None = None
    quant_method: str | None = None      # the checkpoint's quantization_config.quant_method
    head_quantized: bool | None = None   # the checkpoint quantises lm_head itself
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_architecture(cls, arch: str | None) -> "ModelFacts":
        if arch is None:
            return cls()
        facts = cls(architecture=arch, source="profile")
        if arch in DENSE_ARCHS:
            facts.moe = False
        elif arch in MOE_ARCHS:
            facts.moe = True
        else:
            facts.notes.append(f"{arch} is not a Qwen3-Next family architecture radiance patches")
        return facts

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelFacts":
        archs = cfg.get("architectures") or [None]
        facts = cls.from_architecture(archs[0])
        facts.source = "config.json"
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        model_type = str(text.get("model_type") or cfg.get("model_type") or "")
        if facts.moe is None and model_type:
            facts.moe = "moe" in model_type or model_type == "qwen3_next" or bool(text.get("num_experts"))
        n = text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers"))
        facts.mtp_layers = int(n) if n is not None else 0
        tie = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
        facts.tied_head = bool(tie) if tie is not None else None
        q = cfg.get("quantization_config") or {}
        if q:
            facts.quant_method = str(q.get("quant_method") or "")
            skipped = list(q.get("modules_to_not_convert") or q.get("ignored_layers") or [])
            if facts.quant_method == "fp8":
                facts.head_quantized = not any(m.endswith("lm_head") for m in skipped)
            else:  # GPTQ / AWQ / AutoRound keep the head unless they say lm_head: true
                facts.head_quantized = bool(q.get("lm_head", False))
        else:
            facts.head_quantized = False
        return facts


@dataclass
class Setup:
    tp: int = 1
    pp: int = 1
    drafter: str = "none"                # none | mtp | dflash | ngram
    quantization: str | None = None      # --quantization
    fp8_lm_head: bool = False
    async_scheduling: bool | None = None  # vLLM's scheduler runs a step ahead (None: not known here)
    runner: str | None = None             # vLLM's model runner, "v1" | "v2" (None: not known here)


@dataclass(frozen=True)
class Rule:
    """When a feature applies, in two parts. ``setup`` is what the serving setup alone rules out: a profile
    that turns the feature on against it is refused (``features.NAME: why — fix: ...``, exit 2), and
    `radiance check` gives the same why for a feature left off. ``model`` decides the rest from what is
    known of the checkpoint, for a setup that passed."""
    setup: Callable[[Setup], str | None]                            # why not, or None
    fix: str                                                         # for a profile that asks anyway
    model: Callable[[ModelFacts, Setup], tuple[bool | None, str]]


def applicability(name: str, facts: ModelFacts, setup: Setup) -> tuple[bool | None, str]:
    """(True: applies, False: would decline, None: cannot tell from what is known; the reason)."""
    rule = _RULES[name]
    why = rule.setup(setup)
    if why:
        return False, why
    return rule.model(facts, setup)


def setup_refusal(name: str, setup: Setup) -> str | None:
    """A profile turning ``name`` on with this setup: the problem and its fix in one line, or None."""
    rule = _RULES[name]
    why = rule.setup(setup)
    return f"{why} — fix: {rule.fix}" if why else None


def _needs_mtp(s: Setup) -> str | None:
    if s.drafter != "mtp":
        return f"controls MTP drafting: needs an mtp drafter (drafter.type is {s.drafter!r})"
    return None


def _needs_linears(s: Setup) -> str | None:
    if s.drafter not in ("mtp", "dflash"):
        return f"needs a drafter with linears to convert (mtp or dflash; drafter.type is {s.drafter!r})"
    return None


def _no_fp8_head(s: Setup) -> str | None:
    return "excludes an fp8 lm_head (model.fp8_lm_head is true)" if s.fp8_lm_head else None


def _needs_tp(s: Setup) -> str | None:
    if s.tp < 2 or s.pp != 1:
        return f"needs parallel.tp > 1 and parallel.pp == 1 (tp={s.tp}, pp={s.pp})"
    return None


def _dynamic_draft(facts: ModelFacts, s: Setup) -> tuple[bool | None, str]:
    if facts.mtp_layers == 0:
        return False, "the checkpoint has no MTP layer"
    mode = {True: "asynchronous scheduling (vLLM's GPU default)", False: "synchronous scheduling",
            None: "either scheduling"}[s.async_scheduling]
    v2 = ("on Model Runner V2 the target verifies the chosen depth, with full CUDA graphs captured for every depth "
          "1..k (the launcher names each in vLLM's num_speculative_tokens_per_batch_size), so a shallower step "
          "saves drafter forwards and verification width")
    v1 = ("on Model Runner V1 the target verifies the configured depth every step (its full CUDA graph is kept), "
          "so a shallower step saves MTP forwards only")
    # runner not known before the probe: both, V2 first (vLLM's pick on a GPU)
    how = {"v2": v2, "v1": v1, None: f"{v2} (vLLM's GPU default); {v1}"}[s.runner]
    return True, ("vLLM's scheduler chooses each step's MTP depth on the host before the step, from the "
                  "acceptance and step times of finished steps; nothing waits for the GPU, so it serves under "
                  f"{mode}; {how}")


def _w4_drafter(facts: ModelFacts, s: Setup) -> tuple[bool | None, str]:
    if s.drafter == "dflash":
        return True, "the DFlash drafter's qkv / o / gate_up / down (fc is declined by name)"
    if facts.mtp_layers == 0:
        return False, "the checkpoint has no MTP layer"
    if facts.moe:
        return True, ("the MTP layer's attention projections only: its routed experts are FusedMoE and "
                      "stay as loaded")
    if facts.moe is None:
        return None, "the MTP layer's linears, if the checkpoint has one (architecture not known)"
    return True, "the MTP layer's qkv / o / gate_up / down (fc is declined by name)"


def _int4_head(facts: ModelFacts, s: Setup) -> tuple[bool | None, str]:
    if facts.tied_head:
        return False, "the head is tied to the input embedding"
    if facts.head_quantized:
        return False, f"the {facts.quant_method} checkpoint quantises lm_head itself"
    if facts.tied_head is None or facts.head_quantized is None:
        return None, "the head's tie and quantisation are read from config.json, which is not here"
    return True, ("untied, unquantised head: W4A16, group 128, quantised in row chunks at load; on a GPU "
                  "each head call takes 4 bits only where they are not slower: both heads are timed at load "
                  "at every row count the steps make (B x (k+1) verification rows, the MTP drafter's B rows, "
                  "B up to max_num_seqs); calls above the row count where 4 bits start to lose go to the bf16 "
                  "head, kept loaded for them (+1/4 of its size); declined if 4 bits lose at every row count "
                  "(H200, 27B head: 4 bits to ~80 rows, bf16 at B=32's 160 verification rows)")


# model.quantization values whose linears take the epilogue's (q, scale), and the checkpoints each serves
# (config.json's quant_method; None: unquantised). radiance_w4 refuses asymmetric GPTQ at load, by name.
FUSED_AR_UNVERIFIED = "unverified on this hardware"
_STREAM_CONSUMERS = {"radiance_fp8": (None, "fp8"), "radiance_w4": (None, "fp8", "gptq")}
_CHECKPOINTS = {None: "bf16", "fp8": "block-fp8", "gptq": "symmetric group-128 GPTQ"}


def _fp8_stream(facts: ModelFacts, s: Setup) -> tuple[bool | None, str]:
    if facts.moe:
        return False, ("every post-attention site feeds a sparse-MoE block (router, experts and shared expert "
                       "read the activation): the plan declines as a whole")
    if s.quantization not in _STREAM_CONSUMERS:
        return False, ("no consumer takes a pre-quantised (q, scale) input — fix: model.quantization: "
                       "radiance_fp8 (W8A8 consumers) or radiance_w4 (4-bit W4A8 consumers)")
    if facts.quant_method not in _STREAM_CONSUMERS[s.quantization]:
        return False, (f"{s.quantization} serves "
                       f"{' / '.join(_CHECKPOINTS[m] for m in _STREAM_CONSUMERS[s.quantization])} "
                       f"checkpoints, not {facts.quant_method}")
    where = ("; the DFlash taps keep the stock contract at their layer boundaries"
             if s.drafter == "dflash" else "")
    if s.tp == 2:
        # The two-rank kernel has not yet run on two GPUs; it checks itself at load on the ranks it serves.
        where += ("; the fused two-rank all-reduce epilogue (GPUs, RADIANCE_FP8_STREAM_FUSED_AR) is "
                  f"{FUSED_AR_UNVERIFIED}: it checks itself against NCCL at load and is off on every rank on "
                  "a difference")
    if facts.moe is None:
        return None, f"applies to a dense model (architecture not known){where}"
    if s.quantization == "radiance_w4":
        mode = ("4-bit weights (group 128) against the epilogue's per-token fp8: W4A8 consumers, "
                + {None: "quantised at load", "fp8": "quantised at load from the block-fp8 weights",
                   "gptq": "the GPTQ codes repacked"}[facts.quant_method])
    elif facts.quant_method == "fp8":
        mode = "the checkpoint's 128x128 fp8 weights, group-128 activations"
    elif facts.source == "config.json":
        mode = "online W8A8 of the bf16 weights, per-token activations"
    else:
        mode = "a block-fp8 checkpoint's weights as stored, or a bf16 one's quantised online"
    return True, f"dense MLPs: attention and MLP sites stream ({mode}){where}"


_RULES = {
    "dynamic_draft": Rule(_needs_mtp, "set drafter.type: mtp or turn dynamic_draft off", _dynamic_draft),
    "w4_drafter": Rule(_needs_linears, "choose such a drafter or turn w4_drafter off", _w4_drafter),
    "int4_head": Rule(_no_fp8_head, "turn one of them off", _int4_head),
    "fp8_stream": Rule(_needs_tp, "run with tp >= 2 and pp 1, or turn fp8_stream off", _fp8_stream),
}
assert set(_RULES) == set(NAMES)
