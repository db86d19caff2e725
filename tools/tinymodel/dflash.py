"""Tiny random-weight DFlash drafters that vLLM 0.32 runs on CPU.

``write_pair(out_dir, seed)`` writes ``out_dir/target`` (a dense Qwen3, the architecture
``DFlashDraftModel`` drafters are distilled against) and ``out_dir/drafter`` (a DFlash drafter
for it). Only tests use it (the DFlash path of the w4-drafter), so nothing is cached or committed:
a test writes the pair into its tmp dir in a couple of seconds.

``write_drafter_for(target_dir, out_dir, seed, state=None)`` writes a DFlash drafter for an existing
target -- the trained tiny Qwen3.5: its tokenizer, vocabulary and special ids, one layer per target
full-attention layer, conditioned on target layers ``TARGET_LAYER_IDS``. With ``state`` (trained by
tools/train_tiny/dflash.py) it is ``models/tiny-qwen3.5-dflash-trained``, the DFlash profiles'
``builtin:tiny-qwen3.5-dflash``; without, random weights whose drafts are never accepted.

What vLLM reads from the drafter (``qwen3_dflash.py``, ``config/speculative.py``):

* ``architectures: ["DFlashDraftModel"]`` with ``model_type: qwen3``; vLLM wraps the config in
  an ``EAGLEConfig`` and keeps the name (it already starts with ``DFlash``);
* ``dflash_config.target_layer_ids``: which target layers' outputs are concatenated into ``fc``
  (vLLM adds one to each to get its aux-hidden-state layer ids), so ``fc`` is
  ``[hidden, hidden * len(target_layer_ids)]``;
* ``dflash_config.mask_token_id``: the token the K masked query slots are embedded as;
* checkpoint names without a ``model.`` prefix: ``layers.N.*``, ``fc``, ``hidden_norm``, ``norm``.
  No ``embed_tokens`` / ``lm_head``: vLLM aliases the target's into the drafter.

With the default ``DIMS`` every dimension the drafter's linears multiply over is a multiple of
128 (the w4 group size), so each of its qkv / o / gate_up / down is convertible and only ``fc``
is declined by name; ``UNCONVERTIBLE`` is a pair in which no drafter linear is.

Random weights alone give a drafter that never agrees with its target (acceptance 0), and then
the verify path never sees an accepted draft. ``agreeing=True`` (the default) fixes that by
construction rather than by training: the layers only nudge the residual stream (o_proj and
down_proj at a tenth of the usual std), and the LM head's row for the mask token is the mask
token's own embedding, so that token is a fixed point of the target (once emitted, it repeats)
that a good share of other tokens lead into, and it is what the drafter's mask slots (embedded
as that token) propose. Requests then accept whole drafts once they reach it and none before,
at different steps: accepted lengths and rejected slots vary across a batch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import NamedTuple

from tools.tinymodel import config as base


class Dims(NamedTuple):
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


# qkv 512x256, o 256x256, gate_up 1024x256, down 256x512: all K multiples of 128.
DIMS = Dims(hidden=base.HIDDEN, heads=base.NUM_HEADS, kv_heads=base.NUM_KV_HEADS, head_dim=base.HEAD_DIM,
            intermediate=512)
# K = 192 (qkv, o, gate_up) and 320 (down): nothing the w4-drafter can take.
UNCONVERTIBLE = Dims(hidden=192, heads=3, kv_heads=1, head_dim=base.HEAD_DIM, intermediate=320)
TARGET_LAYERS = 4
DRAFT_LAYERS = 2
# Zero-based target layers the drafter conditions on (the published drafters spread theirs over depth).
TARGET_LAYER_IDS = (1, 2)
INIT_STD = 0.02
RESIDUAL_SCALE = 0.1   # agreeing pair: std factor of o_proj / down_proj
STICKY_LOGIT = 1.0     # agreeing pair: norm of the mask token's LM-head row (a fraction of tokens lead into it)
METADATA_FILE = "radiance_tiny.json"
DRAFTER_FORMAT = 2  # bump when write_drafter_for writes other bytes for the same seed
_RESIDUAL_WRITERS = ("o_proj.weight", "down_proj.weight")


def _qwen3_config(dims: Dims, *, layers: int, eos_id: int, pad_id: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": base.VOCAB_SIZE,
        "hidden_size": dims.hidden,
        "intermediate_size": dims.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.kv_heads,
        "head_dim": dims.head_dim,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "rms_norm_eps": base.RMS_EPS,
        "max_position_embeddings": base.MAX_POSITIONS,
        "rope_theta": base.ROPE_THETA,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "use_cache": True,
        "use_sliding_window": False,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }


def write_drafter_for(target_dir: Path, out_dir: Path, seed: int = 0, *, dims: Dims = DIMS,
                      state: dict | None = None, meta: dict | None = None) -> Path:
    """A DFlash drafter for the target checkpoint in ``target_dir``: random weights (deterministic for a
    seed) or ``state`` (trained: tools/train_tiny/dflash.py), with ``meta`` in its metadata file."""
    from tools.tinymodel import weights

    target_dir, out_dir = Path(target_dir), Path(out_dir)
    tcfg = json.loads((target_dir / "config.json").read_text())
    text = tcfg.get("text_config", tcfg)
    if text["hidden_size"] != dims.hidden:
        raise ValueError(f"the target's hidden size is {text['hidden_size']}, the drafter's {dims.hidden}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target_dir / name, out_dir / name)
    eos = text.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    pad = text.get("pad_token_id")
    # One layer per full-attention layer of the target: vLLM's hybrid KV-cache manager groups layers
    # in runs of the smallest per-type count (1 here), and a drafter's layers must share one group.
    layers = sum(t == "full_attention" for t in text.get("layer_types", [])) or DRAFT_LAYERS
    cfg = drafter_config(dims, eos_id=eos, pad_id=pad, mask_token_id=pad, layers=layers)
    cfg["num_target_layers"] = text["num_hidden_layers"]
    cfg["vocab_size"] = text["vocab_size"]
    _write_json(out_dir / "config.json", cfg)
    names = [n for n, _, _ in drafter_layout(dims, layers)]
    if state is None:
        state = random_state_dict(drafter_layout(dims, layers), seed + 1)
    elif sorted(state) != sorted(names):
        raise ValueError(f"drafter state does not match the layout: {sorted(set(state) ^ set(names))}")
    weights.save({n: state[n].contiguous() for n in names}, out_dir)
    _write_json(out_dir / METADATA_FILE, {"generator": "tools.tinymodel.dflash",
                                         "kind": "dflash-drafter" if meta is None else "dflash-drafter-trained",
                                         "seed": seed, "dims": dims._asdict(), "agreeing": False,
                                         "mask_token_id": pad, "target": target_dir.name,
                                         "format_version": DRAFTER_FORMAT, **(meta or {})})
    return out_dir


def target_config(dims: Dims = DIMS, *, eos_id: int, pad_id: int) -> dict:
    return _qwen3_config(dims, layers=TARGET_LAYERS, eos_id=eos_id, pad_id=pad_id)


def drafter_config(dims: Dims = DIMS, *, eos_id: int, pad_id: int, mask_token_id: int,
                   layers: int = DRAFT_LAYERS) -> dict:
    cfg = _qwen3_config(dims, layers=layers, eos_id=eos_id, pad_id=pad_id)
    cfg.update({
        "architectures": ["DFlashDraftModel"],
        "num_target_layers": TARGET_LAYERS,
        "block_size": 8,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(TARGET_LAYER_IDS)},
    })
    return cfg


def _decoder_layer(dims: Dims, prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
    h, q, kv = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    # Qwen3's RMSNorm is plain (scale = w), so the norms start at one.
    return [
        (f"{prefix}.input_layernorm.weight", (h,), "one_norm"),
        (f"{prefix}.self_attn.q_proj.weight", (q, h), "linear"),
        (f"{prefix}.self_attn.k_proj.weight", (kv, h), "linear"),
        (f"{prefix}.self_attn.v_proj.weight", (kv, h), "linear"),
        (f"{prefix}.self_attn.o_proj.weight", (h, q), "linear"),
        (f"{prefix}.self_attn.q_norm.weight", (dims.head_dim,), "one_norm"),
        (f"{prefix}.self_attn.k_norm.weight", (dims.head_dim,), "one_norm"),
        (f"{prefix}.post_attention_layernorm.weight", (h,), "one_norm"),
        (f"{prefix}.mlp.gate_proj.weight", (dims.intermediate, h), "linear"),
        (f"{prefix}.mlp.up_proj.weight", (dims.intermediate, h), "linear"),
        (f"{prefix}.mlp.down_proj.weight", (h, dims.intermediate), "linear"),
    ]


def target_layout(dims: Dims = DIMS) -> list[tuple[str, tuple[int, ...], str]]:
    out = [("model.embed_tokens.weight", (base.VOCAB_SIZE, dims.hidden), "embed")]
    for i in range(TARGET_LAYERS):
        out += _decoder_layer(dims, f"model.layers.{i}")
    out += [("model.norm.weight", (dims.hidden,), "one_norm"),
            ("lm_head.weight", (base.VOCAB_SIZE, dims.hidden), "linear")]
    return out


def drafter_layout(dims: Dims = DIMS, layers: int = DRAFT_LAYERS) -> list[tuple[str, tuple[int, ...], str]]:
    out = []
    for i in range(layers):
        out += _decoder_layer(dims, f"layers.{i}")
    out += [
        ("fc.weight", (dims.hidden, dims.hidden * len(TARGET_LAYER_IDS)), "linear"),
        ("hidden_norm.weight", (dims.hidden,), "one_norm"),
        ("norm.weight", (dims.hidden,), "one_norm"),
    ]
    return out


def random_state_dict(layout: list[tuple[str, tuple[int, ...], str]], seed: int,
                      residual_scale: float = 1.0) -> dict:
    """bf16 tensors from torch's CPU generator only: the same seed gives the same bytes.
    ``residual_scale`` multiplies the std of o_proj and down_proj."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out = {}
    for name, shape, role in layout:
        if role in ("linear", "embed"):
            std = INIT_STD * (residual_scale if name.endswith(_RESIDUAL_WRITERS) else 1.0)
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
        elif role == "one_norm":
            t = torch.ones(shape, dtype=torch.float32)
        else:
            raise ValueError(f"unknown tensor role {role!r} for {name}")
        out[name] = t.to(torch.bfloat16).contiguous()
    return out


def make_sticky(state: dict, token: int, norm: float = STICKY_LOGIT) -> None:
    """Point the LM head's row for ``token`` along its own embedding (see the module docstring)."""
    emb = state["model.embed_tokens.weight"][token].float()
    state["lm_head.weight"][token] = (emb * (norm / emb.norm())).to(state["lm_head.weight"].dtype)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_pair(out_dir: Path, seed: int = 0, gsm8k_dir: Path | None = None, *, dims: Dims = DIMS,
               agreeing: bool = True) -> tuple[Path, Path]:
    """Write ``out_dir/target`` and ``out_dir/drafter`` (deterministic for a seed); return both."""
    from tools.tinymodel import generate, weights

    out_dir = Path(out_dir)
    target, drafter = out_dir / "target", out_dir / "drafter"
    target.mkdir(parents=True, exist_ok=True)
    drafter.mkdir(parents=True, exist_ok=True)
    ids, provenance = generate.write_tokenizer(target, gsm8k_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(target / name, drafter / name)
    # The mask slots need an id with an embedding row and no meaning of its own: the pad token.
    mask = ids["pad"]
    _write_json(target / "config.json", target_config(dims, eos_id=ids["im_end"], pad_id=ids["pad"]))
    _write_json(target / "generation_config.json",
                {"bos_token_id": None, "eos_token_id": [ids["im_end"], ids["pad"]], "pad_token_id": ids["pad"]})
    _write_json(drafter / "config.json",
                drafter_config(dims, eos_id=ids["im_end"], pad_id=ids["pad"], mask_token_id=mask))
    scale = RESIDUAL_SCALE if agreeing else 1.0
    state = random_state_dict(target_layout(dims), seed, scale)
    if agreeing:
        make_sticky(state, mask)
    weights.save(state, target)
    # A different stream for the drafter, so it is not a slice of the target by construction.
    weights.save(random_state_dict(drafter_layout(dims), seed + 1, scale), drafter)
    for path, kind in ((target, "dflash-target"), (drafter, "dflash-drafter")):
        _write_json(path / METADATA_FILE, {"generator": "tools.tinymodel.dflash", "kind": kind, "seed": seed,
                                           "dims": dims._asdict(), "agreeing": agreeing, "mask_token_id": mask,
                                           **provenance})
    return target, drafter
