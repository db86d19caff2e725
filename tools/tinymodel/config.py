"""Architectures of the tiny test models and the exact tensor layout of their checkpoints.

Stdlib only: the launcher, the generator and the trainer (tools/train_tiny, which runs where vLLM is
absent) all read the same numbers from here, so the random and the trained models cannot drift apart.

Two members of the Qwen3-Next family, each an ``Arch``:

* ``QWEN3_NEXT`` -- ``Qwen3NextForCausalLM``: GDN + gated attention, sparse MoE (4 experts top-2 +
  a shared expert) in every layer, the GDN input projections interleaved per key-head group.
* ``QWEN3_5`` -- ``Qwen3_5ForCausalLM`` (the dense member; Qwen3.5-27B's architecture): the same
  GDN + gated attention, a dense SiLU MLP in every layer, the GDN input projections stored
  separately (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``; vLLM fuses them into a
  4-shard qkvz and a 2-shard ba), the MTP depth in ``mtp_num_hidden_layers``.

Sizes are chosen for vLLM's CPU kernels and for TP=2:
- full-attention head_dim 64 / 128 is in the CPU attention backend's supported list;
- head counts, experts and intermediate sizes split evenly over two ranks (vLLM asserts head
  counts divisible by TP, and TP <= num_experts);
- vocab 4096 is a multiple of 64 so the padded vocab equals the real one;
- ``QWEN3_5``: every linear a TP=2 rank holds is a whole number of 128x128 blocks (q/k/v with
  head_dim 128 and 2 KV heads, GDN key/value dims 256/512, MLP 512), so its block-fp8 variant
  converts all of them but the 4-row GDN ``in_proj_b`` / ``in_proj_a`` (as the published FP8
  checkpoints keep them).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str                  # builtin model name stem ("tiny-qwen3next", "tiny-qwen3.5")
    architecture: str          # config.json "architectures"
    model_type: str
    hidden: int
    num_layers: int
    full_attention_interval: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_k_heads: int
    linear_v_heads: int
    linear_k_dim: int
    linear_v_dim: int
    dense_intermediate: int
    num_experts: int = 0        # 0: a dense MLP in every layer
    experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    interleaved_gdn: bool = True  # Qwen3-Next's per-key-head-group qkvz / ba layout
    vocab: int = 4096
    conv_kernel: int = 4
    max_positions: int = 4096
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary: float = 0.25
    num_mtp_layers: int = 1

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def key_dim(self) -> int:
        return self.linear_k_heads * self.linear_k_dim

    @property
    def value_dim(self) -> int:
        return self.linear_v_heads * self.linear_v_dim


QWEN3_NEXT = Arch(
    name="tiny-qwen3next", architecture="Qwen3NextForCausalLM", model_type="qwen3_next",
    hidden=256, num_layers=4, full_attention_interval=4, heads=4, kv_heads=2, head_dim=64,
    linear_k_heads=2, linear_v_heads=4, linear_k_dim=64, linear_v_dim=64, dense_intermediate=512,
    num_experts=4, experts_per_tok=2, moe_intermediate=256, shared_intermediate=256,
    interleaved_gdn=True,
)
QWEN3_5 = Arch(
    name="tiny-qwen3.5", architecture="Qwen3_5ForCausalLM", model_type="qwen3_5_text",
    hidden=256, num_layers=4, full_attention_interval=4, heads=4, kv_heads=2, head_dim=128,
    linear_k_heads=2, linear_v_heads=4, linear_k_dim=128, linear_v_dim=128, dense_intermediate=512,
    interleaved_gdn=False,
)
ARCHS = {a.name: a for a in (QWEN3_NEXT, QWEN3_5)}


def arch_of(hf_config: dict) -> Arch:
    """The tiny architecture a config.json was written for (by its model_type)."""
    for a in ARCHS.values():
        if hf_config.get("model_type") == a.model_type:
            return a
    raise ValueError(f"model_type {hf_config.get('model_type')!r} is not a tiny architecture")

# The Qwen3-Next numbers by name (the DFlash pair, the tokenizer and older tests read these).
VOCAB_SIZE = QWEN3_NEXT.vocab
HIDDEN = QWEN3_NEXT.hidden
NUM_LAYERS = QWEN3_NEXT.num_layers
FULL_ATTENTION_INTERVAL = QWEN3_NEXT.full_attention_interval
NUM_HEADS = QWEN3_NEXT.heads
NUM_KV_HEADS = QWEN3_NEXT.kv_heads
HEAD_DIM = QWEN3_NEXT.head_dim
LINEAR_K_HEADS = QWEN3_NEXT.linear_k_heads
LINEAR_V_HEADS = QWEN3_NEXT.linear_v_heads
LINEAR_K_DIM = QWEN3_NEXT.linear_k_dim
LINEAR_V_DIM = QWEN3_NEXT.linear_v_dim
CONV_KERNEL = QWEN3_NEXT.conv_kernel
NUM_EXPERTS = QWEN3_NEXT.num_experts
EXPERTS_PER_TOK = QWEN3_NEXT.experts_per_tok
MOE_INTERMEDIATE = QWEN3_NEXT.moe_intermediate
SHARED_INTERMEDIATE = QWEN3_NEXT.shared_intermediate
DENSE_INTERMEDIATE = QWEN3_NEXT.dense_intermediate
MAX_POSITIONS = QWEN3_NEXT.max_positions
RMS_EPS = QWEN3_NEXT.rms_eps
ROPE_THETA = QWEN3_NEXT.rope_theta
PARTIAL_ROTARY = QWEN3_NEXT.partial_rotary
NUM_MTP_LAYERS = QWEN3_NEXT.num_mtp_layers


def layer_types(arch: Arch = QWEN3_NEXT) -> list[str]:
    return [
        "full_attention" if (i + 1) % arch.full_attention_interval == 0 else "linear_attention"
        for i in range(arch.num_layers)
    ]


def check_mlp_only_layers(mlp_only_layers, arch: Arch = QWEN3_NEXT) -> tuple[int, ...]:
    """Decoder layers whose MLP is dense (``mlp_only_layers``); the rest stay sparse MoE.

    At least one layer must stay MoE: vLLM's Qwen3NextForCausalLM refuses a model without one
    (``set_moe_parameters``: "No Qwen3Next layer found"). The MTP block's layer ``j`` follows
    decoder index ``j`` (vLLM derives its index from the ``mtp.layers.j`` prefix). A dense
    architecture has no MoE layers to choose: it takes only an empty list.
    """
    layers = tuple(sorted({int(i) for i in mlp_only_layers}))
    if not arch.moe:
        if layers:
            raise ValueError(f"mlp_only_layers {layers}: {arch.name} is dense in every layer already")
        return ()
    if any(not 0 <= i < arch.num_layers for i in layers):
        raise ValueError(f"mlp_only_layers {layers}: indices must lie in [0, {arch.num_layers})")
    if len(layers) == arch.num_layers:
        raise ValueError("mlp_only_layers may not cover every layer: vLLM's Qwen3NextForCausalLM "
                         "needs at least one sparse-MoE layer")
    return layers


def hf_config(*, bos_id: int | None, eos_id: int, pad_id: int, mlp_only_layers=(),
              arch: Arch = QWEN3_NEXT) -> dict:
    """config.json contents; field names follow the published checkpoints of each architecture."""
    cfg = {
        "architectures": [arch.architecture],
        "model_type": arch.model_type,
        "vocab_size": arch.vocab,
        "hidden_size": arch.hidden,
        # The dense MLPs' width (mlp_only_layers / every layer of a dense model).
        "intermediate_size": arch.dense_intermediate,
        "num_hidden_layers": arch.num_layers,
        "layer_types": layer_types(arch),
        "full_attention_interval": arch.full_attention_interval,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads,
        "head_dim": arch.head_dim,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": arch.linear_k_heads,
        "linear_num_value_heads": arch.linear_v_heads,
        "linear_key_head_dim": arch.linear_k_dim,
        "linear_value_head_dim": arch.linear_v_dim,
        "linear_conv_kernel_dim": arch.conv_kernel,
        "hidden_act": "silu",
        "rms_norm_eps": arch.rms_eps,
        "max_position_embeddings": arch.max_positions,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }
    if arch.moe:
        cfg.update({
            "num_experts": arch.num_experts,
            "num_experts_per_tok": arch.experts_per_tok,
            "moe_intermediate_size": arch.moe_intermediate,
            "shared_expert_intermediate_size": arch.shared_intermediate,
            "decoder_sparse_step": 1,
            "mlp_only_layers": list(check_mlp_only_layers(mlp_only_layers, arch)),
            "norm_topk_prob": True,
            "router_aux_loss_coef": 0.001,
            "output_router_logits": False,
            "rope_theta": arch.rope_theta,
            "partial_rotary_factor": arch.partial_rotary,
            "rope_scaling": None,
            "num_nextn_predict_layers": arch.num_mtp_layers,
            "use_sliding_window": False,
        })
    else:
        # transformers 5's Qwen3_5TextConfig: rope in rope_parameters, MTP depth by its own name.
        check_mlp_only_layers(mlp_only_layers, arch)
        cfg.update({
            "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta,
                                "partial_rotary_factor": arch.partial_rotary},
            "mtp_num_hidden_layers": arch.num_mtp_layers,
        })
    return cfg


# Tensor roles decide the random init (and the trainer's init): "linear" ~ N(0, std),
# "embed" ~ N(0, std), "zero_norm" = 0 (the family's RMSNorms are Gemma-style, scale = 1 + w),
# "one_norm" = 1 (the GDN output norm is a plain gated RMSNorm), "a_log", "dt_bias", "conv".
Layout = list[tuple[str, tuple[int, ...], str]]


def _attention(a: Arch, prefix: str) -> Layout:
    return [
        # q_proj carries the output gate: per head [q (head_dim), gate (head_dim)].
        (f"{prefix}.self_attn.q_proj.weight", (2 * a.heads * a.head_dim, a.hidden), "linear"),
        (f"{prefix}.self_attn.k_proj.weight", (a.kv_heads * a.head_dim, a.hidden), "linear"),
        (f"{prefix}.self_attn.v_proj.weight", (a.kv_heads * a.head_dim, a.hidden), "linear"),
        (f"{prefix}.self_attn.o_proj.weight", (a.hidden, a.heads * a.head_dim), "linear"),
        (f"{prefix}.self_attn.q_norm.weight", (a.head_dim,), "zero_norm"),
        (f"{prefix}.self_attn.k_norm.weight", (a.head_dim,), "zero_norm"),
    ]


def _linear_attention(a: Arch, prefix: str) -> Layout:
    p = f"{prefix}.linear_attn"
    if a.interleaved_gdn:
        proj = [
            # Interleaved per key-head group: [q, k, v (group's value heads), z (same)].
            (f"{p}.in_proj_qkvz.weight", (2 * a.key_dim + 2 * a.value_dim, a.hidden), "linear"),
            # Interleaved per key-head group: [b (group's value heads), a (same)].
            (f"{p}.in_proj_ba.weight", (2 * a.linear_v_heads, a.hidden), "linear"),
        ]
    else:
        proj = [  # flat: all q heads, all k heads, all v heads; z, b and a on their own
            (f"{p}.in_proj_qkv.weight", (2 * a.key_dim + a.value_dim, a.hidden), "linear"),
            (f"{p}.in_proj_z.weight", (a.value_dim, a.hidden), "linear"),
            (f"{p}.in_proj_b.weight", (a.linear_v_heads, a.hidden), "linear"),
            (f"{p}.in_proj_a.weight", (a.linear_v_heads, a.hidden), "linear"),
        ]
    return proj + [
        (f"{p}.conv1d.weight", (2 * a.key_dim + a.value_dim, 1, a.conv_kernel), "conv"),
        (f"{p}.dt_bias", (a.linear_v_heads,), "dt_bias"),
        (f"{p}.A_log", (a.linear_v_heads,), "a_log"),
        (f"{p}.norm.weight", (a.linear_v_dim,), "one_norm"),
        (f"{p}.out_proj.weight", (a.hidden, a.value_dim), "linear"),
    ]


def _moe(a: Arch, prefix: str) -> Layout:
    out = [(f"{prefix}.mlp.gate.weight", (a.num_experts, a.hidden), "linear")]
    for e in range(a.num_experts):
        out += [
            (f"{prefix}.mlp.experts.{e}.gate_proj.weight", (a.moe_intermediate, a.hidden), "linear"),
            (f"{prefix}.mlp.experts.{e}.up_proj.weight", (a.moe_intermediate, a.hidden), "linear"),
            (f"{prefix}.mlp.experts.{e}.down_proj.weight", (a.hidden, a.moe_intermediate), "linear"),
        ]
    out += [
        (f"{prefix}.mlp.shared_expert.gate_proj.weight", (a.shared_intermediate, a.hidden), "linear"),
        (f"{prefix}.mlp.shared_expert.up_proj.weight", (a.shared_intermediate, a.hidden), "linear"),
        (f"{prefix}.mlp.shared_expert.down_proj.weight", (a.hidden, a.shared_intermediate), "linear"),
        (f"{prefix}.mlp.shared_expert_gate.weight", (1, a.hidden), "linear"),
    ]
    return out


def _dense(a: Arch, prefix: str) -> Layout:
    return [
        (f"{prefix}.mlp.gate_proj.weight", (a.dense_intermediate, a.hidden), "linear"),
        (f"{prefix}.mlp.up_proj.weight", (a.dense_intermediate, a.hidden), "linear"),
        (f"{prefix}.mlp.down_proj.weight", (a.hidden, a.dense_intermediate), "linear"),
    ]


def _decoder_layer(a: Arch, prefix: str, layer_type: str, dense: bool) -> Layout:
    mixer = _attention(a, prefix) if layer_type == "full_attention" else _linear_attention(a, prefix)
    return (
        [(f"{prefix}.input_layernorm.weight", (a.hidden,), "zero_norm")]
        + mixer
        + [(f"{prefix}.post_attention_layernorm.weight", (a.hidden,), "zero_norm")]
        + (_dense(a, prefix) if dense else _moe(a, prefix))
    )


def tensor_layout(mlp_only_layers=(), arch: Arch = QWEN3_NEXT) -> Layout:
    """Every checkpoint tensor as (name, shape, role), in a fixed order.

    Names are the published ones of each architecture. The MTP block lives under ``mtp.``: vLLM's
    target model drops that prefix and its MTP loader renames ``mtp.`` to ``model.``, so it needs
    ``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.layers.0.*`` (a full-attention
    layer; its MLP is MoE on Qwen3-Next unless 0 is in ``mlp_only_layers``) and ``mtp.norm``; it
    shares ``model.embed_tokens`` and ``lm_head`` with the target.
    """
    a = arch
    dense = check_mlp_only_layers(mlp_only_layers, a)

    def is_dense(i: int) -> bool:
        return not a.moe or i in dense

    out = [("model.embed_tokens.weight", (a.vocab, a.hidden), "embed")]
    for i, kind in enumerate(layer_types(a)):
        out += _decoder_layer(a, f"model.layers.{i}", kind, is_dense(i))
    out += [
        ("model.norm.weight", (a.hidden,), "zero_norm"),
        ("lm_head.weight", (a.vocab, a.hidden), "linear"),
        ("mtp.fc.weight", (a.hidden, 2 * a.hidden), "linear"),
        ("mtp.pre_fc_norm_embedding.weight", (a.hidden,), "zero_norm"),
        ("mtp.pre_fc_norm_hidden.weight", (a.hidden,), "zero_norm"),
    ]
    for j in range(a.num_mtp_layers):
        out += _decoder_layer(a, f"mtp.layers.{j}", "full_attention", is_dense(j))
    out.append(("mtp.norm.weight", (a.hidden,), "zero_norm"))
    return out
