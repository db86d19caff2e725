"""Architecture of the tiny Qwen3-Next and the exact tensor layout of its checkpoint.

Stdlib only: the launcher, the generator and the trainer (tools/train_tiny, which runs where vLLM is
absent) all read the same numbers from here, so the random and the trained model cannot drift apart.

Sizes are chosen for vLLM's CPU kernels and for TP=2:
- full-attention head_dim 64 is in the CPU attention backend's supported list;
- 4 query heads / 2 KV heads, 2 GDN key heads / 4 value heads, 4 experts and even intermediate sizes
  all split evenly over two ranks (vLLM asserts head counts divisible by TP, and TP <= num_experts);
- vocab 4096 is a multiple of 64 so the padded vocab equals the real one.
"""

from __future__ import annotations

VOCAB_SIZE = 4096
HIDDEN = 256
NUM_LAYERS = 4
FULL_ATTENTION_INTERVAL = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 64
LINEAR_K_HEADS = 2
LINEAR_V_HEADS = 4
LINEAR_K_DIM = 64
LINEAR_V_DIM = 64
CONV_KERNEL = 4
NUM_EXPERTS = 4
EXPERTS_PER_TOK = 2
MOE_INTERMEDIATE = 256
SHARED_INTERMEDIATE = 256
DENSE_INTERMEDIATE = 2 * MOE_INTERMEDIATE
MAX_POSITIONS = 4096
RMS_EPS = 1e-6
ROPE_THETA = 10000.0
PARTIAL_ROTARY = 0.25
NUM_MTP_LAYERS = 1


def layer_types() -> list[str]:
    return [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for i in range(NUM_LAYERS)
    ]


def check_mlp_only_layers(mlp_only_layers) -> tuple[int, ...]:
    """Decoder layers whose MLP is dense (``mlp_only_layers``); the rest stay sparse MoE.

    At least one layer must stay MoE: vLLM's Qwen3NextForCausalLM refuses a model without one
    (``set_moe_parameters``: "No Qwen3Next layer found"). The MTP block's layer ``j`` follows
    decoder index ``j`` (vLLM derives its index from the ``mtp.layers.j`` prefix).
    """
    layers = tuple(sorted({int(i) for i in mlp_only_layers}))
    if any(not 0 <= i < NUM_LAYERS for i in layers):
        raise ValueError(f"mlp_only_layers {layers}: indices must lie in [0, {NUM_LAYERS})")
    if len(layers) == NUM_LAYERS:
        raise ValueError("mlp_only_layers may not cover every layer: vLLM's Qwen3NextForCausalLM "
                         "needs at least one sparse-MoE layer")
    return layers


def hf_config(*, bos_id: int | None, eos_id: int, pad_id: int, mlp_only_layers=()) -> dict:
    """config.json contents; field names follow the published Qwen3-Next checkpoints."""
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        # The dense MLPs' width (mlp_only_layers); vLLM and transformers read it regardless.
        "intermediate_size": DENSE_INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "layer_types": layer_types(),
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": LINEAR_K_HEADS,
        "linear_num_value_heads": LINEAR_V_HEADS,
        "linear_key_head_dim": LINEAR_K_DIM,
        "linear_value_head_dim": LINEAR_V_DIM,
        "linear_conv_kernel_dim": CONV_KERNEL,
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOK,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "shared_expert_intermediate_size": SHARED_INTERMEDIATE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(check_mlp_only_layers(mlp_only_layers)),
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "hidden_act": "silu",
        "rms_norm_eps": RMS_EPS,
        "max_position_embeddings": MAX_POSITIONS,
        "rope_theta": ROPE_THETA,
        "partial_rotary_factor": PARTIAL_ROTARY,
        "rope_scaling": None,
        "num_nextn_predict_layers": NUM_MTP_LAYERS,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }


# Tensor roles decide the random init (and the trainer's init): "linear" ~ N(0, std),
# "embed" ~ N(0, std), "zero_norm" = 0 (Qwen3-Next RMSNorms are Gemma-style, scale = 1 + w),
# "one_norm" = 1 (the GDN output norm is a plain gated RMSNorm), "a_log", "dt_bias", "conv".
def _attention(prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        # q_proj carries the output gate: per head [q (head_dim), gate (head_dim)].
        (f"{prefix}.self_attn.q_proj.weight", (2 * NUM_HEADS * HEAD_DIM, HIDDEN), "linear"),
        (f"{prefix}.self_attn.k_proj.weight", (NUM_KV_HEADS * HEAD_DIM, HIDDEN), "linear"),
        (f"{prefix}.self_attn.v_proj.weight", (NUM_KV_HEADS * HEAD_DIM, HIDDEN), "linear"),
        (f"{prefix}.self_attn.o_proj.weight", (HIDDEN, NUM_HEADS * HEAD_DIM), "linear"),
        (f"{prefix}.self_attn.q_norm.weight", (HEAD_DIM,), "zero_norm"),
        (f"{prefix}.self_attn.k_norm.weight", (HEAD_DIM,), "zero_norm"),
    ]


def _linear_attention(prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
    key_dim = LINEAR_K_HEADS * LINEAR_K_DIM
    value_dim = LINEAR_V_HEADS * LINEAR_V_DIM
    return [
        # Interleaved per key-head group: [q, k, v (group's value heads), z (same)].
        (f"{prefix}.linear_attn.in_proj_qkvz.weight", (2 * key_dim + 2 * value_dim, HIDDEN), "linear"),
        # Interleaved per key-head group: [b (group's value heads), a (same)].
        (f"{prefix}.linear_attn.in_proj_ba.weight", (2 * LINEAR_V_HEADS, HIDDEN), "linear"),
        (f"{prefix}.linear_attn.conv1d.weight", (2 * key_dim + value_dim, 1, CONV_KERNEL), "conv"),
        (f"{prefix}.linear_attn.dt_bias", (LINEAR_V_HEADS,), "dt_bias"),
        (f"{prefix}.linear_attn.A_log", (LINEAR_V_HEADS,), "a_log"),
        (f"{prefix}.linear_attn.norm.weight", (LINEAR_V_DIM,), "one_norm"),
        (f"{prefix}.linear_attn.out_proj.weight", (HIDDEN, value_dim), "linear"),
    ]


def _moe(prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
    out = [(f"{prefix}.mlp.gate.weight", (NUM_EXPERTS, HIDDEN), "linear")]
    for e in range(NUM_EXPERTS):
        out += [
            (f"{prefix}.mlp.experts.{e}.gate_proj.weight", (MOE_INTERMEDIATE, HIDDEN), "linear"),
            (f"{prefix}.mlp.experts.{e}.up_proj.weight", (MOE_INTERMEDIATE, HIDDEN), "linear"),
            (f"{prefix}.mlp.experts.{e}.down_proj.weight", (HIDDEN, MOE_INTERMEDIATE), "linear"),
        ]
    out += [
        (f"{prefix}.mlp.shared_expert.gate_proj.weight", (SHARED_INTERMEDIATE, HIDDEN), "linear"),
        (f"{prefix}.mlp.shared_expert.up_proj.weight", (SHARED_INTERMEDIATE, HIDDEN), "linear"),
        (f"{prefix}.mlp.shared_expert.down_proj.weight", (HIDDEN, SHARED_INTERMEDIATE), "linear"),
        (f"{prefix}.mlp.shared_expert_gate.weight", (1, HIDDEN), "linear"),
    ]
    return out


def _dense(prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        (f"{prefix}.mlp.gate_proj.weight", (DENSE_INTERMEDIATE, HIDDEN), "linear"),
        (f"{prefix}.mlp.up_proj.weight", (DENSE_INTERMEDIATE, HIDDEN), "linear"),
        (f"{prefix}.mlp.down_proj.weight", (HIDDEN, DENSE_INTERMEDIATE), "linear"),
    ]


def _decoder_layer(prefix: str, layer_type: str, dense: bool = False) -> list[tuple[str, tuple[int, ...], str]]:
    mixer = _attention(prefix) if layer_type == "full_attention" else _linear_attention(prefix)
    return (
        [(f"{prefix}.input_layernorm.weight", (HIDDEN,), "zero_norm")]
        + mixer
        + [(f"{prefix}.post_attention_layernorm.weight", (HIDDEN,), "zero_norm")]
        + (_dense(prefix) if dense else _moe(prefix))
    )


def tensor_layout(mlp_only_layers=()) -> list[tuple[str, tuple[int, ...], str]]:
    """Every checkpoint tensor as (name, shape, role), in a fixed order.

    Names are the published Qwen3-Next ones. The MTP block lives under ``mtp.``: vLLM's target model
    drops that prefix and its qwen3_next_mtp loader renames ``mtp.`` to ``model.``, so it needs
    ``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.layers.0.*`` (a full-attention MoE
    layer, dense when 0 is in ``mlp_only_layers``) and ``mtp.norm``; it shares
    ``model.embed_tokens`` and ``lm_head`` with the target.
    """
    dense = check_mlp_only_layers(mlp_only_layers)
    out = [("model.embed_tokens.weight", (VOCAB_SIZE, HIDDEN), "embed")]
    for i, kind in enumerate(layer_types()):
        out += _decoder_layer(f"model.layers.{i}", kind, i in dense)
    out += [
        ("model.norm.weight", (HIDDEN,), "zero_norm"),
        ("lm_head.weight", (VOCAB_SIZE, HIDDEN), "linear"),
        ("mtp.fc.weight", (HIDDEN, 2 * HIDDEN), "linear"),
        ("mtp.pre_fc_norm_embedding.weight", (HIDDEN,), "zero_norm"),
        ("mtp.pre_fc_norm_hidden.weight", (HIDDEN,), "zero_norm"),
    ]
    for j in range(NUM_MTP_LAYERS):
        out += _decoder_layer(f"mtp.layers.{j}", "full_attention", j in dense)
    out.append(("mtp.norm.weight", (HIDDEN,), "zero_norm"))
    return out
