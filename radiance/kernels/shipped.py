"""The per-rank shapes the shipped profiles launch: one list read by every kernel's AOT
registration, by tests/radiance/kernels/test_aot.py (which checks the AOT list against the
launchers) and by benchmarks/check_aot_cache.py (which checks it on a GPU).

The profiles, all at TP=2 (``profiles/``):

* ``qwen3next-tp2.yaml`` and ``qwen3.5-27b-dflash-tp2.yaml``: Qwen3.5-27B from Qwen's block-fp8
  checkpoint (hidden 5120, intermediate 17408, 24 query heads with an output gate and 4 kv heads
  of 256, GDN 16 key / 48 value heads of 128, vocabulary 248320), MTP drafting (k = 4) or the
  z-lab DFlash drafter (k = 8); w4-drafter, int4-head, fp8-stream (``radiance_fp8``, whose block
  mode takes activations per group of 128), dynamic-draft with MTP.
* ``qwen3next-80b-tp2.yaml``: Qwen3-Next-80B-A3B int4 (hidden 2048, vocabulary 151936), MTP
  (k = 4), dynamic-draft and int4-head; fp8-stream and w4-drafter off.

Standard library only; nothing here runs a kernel.
"""
from __future__ import annotations

TP = 2
ACT_DTYPE = "bfloat16"  # every profile's model.dtype

# --- w4a16_gemm (w4-drafter, int4-head): name -> (N, K) per rank, group 128 -----------------
W4A16_GROUP = 128
W4A16: dict[str, tuple[int, int]] = {
    # Qwen3.5-27B's MTP layer: qkv = (24 * 256 * 2 query-and-gate + 2 * 4 * 256 kv) / 2
    "mtp.qkv": (7168, 5120),
    "mtp.o": (5120, 3072),
    "mtp.gate_up": (17408, 5120),
    "mtp.down": (5120, 8704),
    # z-lab/Qwen3.5-27B-DFlash (gate_up and down as the MTP layer's)
    "dflash.qkv": (3072, 5120),
    "dflash.o": (5120, 2048),
    # the int4 heads: vocabulary / 2 by hidden
    "head.qwen3.5-27b": (124160, 5120),
    "head.qwen3-next-80b": (75968, 2048),
}
# Rows: decode batches, verification (batch x (k + 1) for the head) and prefill chunks. Every M up
# to the kernel's limit (w4a16_gemm.LARGE_M) is a possible launch; above it no Triton kernel runs.
W4A16_DECODE_M = (1, 8, 16, 64)

# --- fp8-stream (Qwen3.5-27B profiles) ------------------------------------------------------
FP8_HIDDEN = 5120
# Activation scales: 128 is the block-fp8 checkpoint the profiles serve; 0 (per token) is
# radiance_fp8 on the same model's bf16 checkpoint.
FP8_GROUPS = (0, 128)
# quant_fp8's plain-tensor inputs (radiance/fp8_stream/linear.py ``as_codes``, block.py): o_proj
# and GDN out_proj (K = 3072), down_proj (8704), and the hidden-size inputs of the sites that keep
# the stock contract (DFlash's tapped layers, sparse-MoE boundaries): 5120.
QUANT_FP8_K = (3072, 8704, 5120)
# fp8_gemm (W8A8 linears of radiance_fp8), name -> (N, K) per rank
FP8_GEMM: dict[str, tuple[int, int]] = {
    "attn.qkv": (7168, 5120),
    "attn.o": (5120, 3072),
    "gdn.in_proj_qkvz": (8192, 5120),
    "gdn.out_proj": (5120, 3072),
    "mlp.gate_up": (17408, 5120),
    "mlp.down": (5120, 8704),
}
# w4a8_gemm (radiance_w4's target linears, fed an Fp8Activation per token), name -> (N, K) per
# rank, group 128: radiance_fp8's linears plus the GDN in_proj_ba (48 value heads x (b, a) / 2),
# which radiance_w4 converts too
W4A8_GROUP = 128
W4A8: dict[str, tuple[int, int]] = {**FP8_GEMM, "gdn.in_proj_ba": (48, 5120)}
# gdn_norm_quant (opt-in: features.fp8_stream.gdn_norm_quant): value heads per rank x head dim
GDN_HEADS = 24
GDN_HEAD_DIM = 128
# Tokens per step reach max_num_batched_tokens; kernels whose specialisation depends on M take
# every class of M in 1..MAX_TOKENS (see the fp8_gemm registration).
MAX_TOKENS = 8192
