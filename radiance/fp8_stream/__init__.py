"""fp8-stream: the fp8 residual-stream contract for Qwen3-Next at TP > 1.

Stock vLLM, at every RowParallel site (o_proj / out_proj / down_proj): all-reduce, then
GemmaRMSNorm(residual add), then the consuming fp8 linear quantises the normed activation
again. Here layers exchange ``(partial_sum, residual)``: a deferred site's all-reduce is
followed by ONE fused kernel, ``radiance.kernels.add_rms_quant`` (residual add + the norm
with its own weight + fp8 quant), whose ``(q, scale)`` goes straight into consumers that
take a pre-quantised input. The last layer keeps the stock contract (model.norm and the
drafter see what they see today).

Pieces:
  plan.py        the guards (all of the seed's) and per-site decisions, pure inspection
  contract.py    the decoder-layer forward under the contract; install / uninstall
  patch.py       ``PATCHES``: after vLLM loads a model, plan it, install or decline (one line)
  activation.py  ``Fp8Activation(q, scale, dtype)``: the carrier the epilogue hands on; stock
                 module code (Column/Merged/QKV linears, the GDN forward) passes it through
  linear.py      ``radiance_fp8``: an out-of-tree vLLM quantization config (registered by the
                 plugin in every process, whatever RADIANCE_FP8_STREAM says). On a bf16
                 checkpoint: weights fp8 per output channel at load (per TP shard),
                 activations fp8 per token with add_rms_quant's own quantiser, GEMM
                 ``fp8_gemm``, ``Fp8Input(0, dtype)``. Its methods take a tensor (quantise it:
                 with the contract off, this is the stock fp8 path) or an Fp8Activation.
                 Router gates, lm_head, embeddings and routed experts stay unquantised.
  block.py       the same flag on a block-fp8 checkpoint (DeepSeek/Qwen FP8: e4m3 [N, K] +
                 128x128 ``weight_scale_inv``, dynamic activations): linear.py's
                 ``override_quantization_method`` / ``from_config`` hand it here. Weights and
                 scales load as the file stores them per TP shard (vLLM's fp8 parameters and
                 loaders), activations per token-group of 128 (the epilogue's group mode),
                 GEMM ``fp8_gemm`` group x block, ``Fp8Input(128, dtype)``. Consumers the
                 checkpoint keeps in bf16 (GDN in_proj_ba, unblockable q/k/v) keep their
                 weights and dequantise the same group-128 input, so their sites still stream.
                 e4m3fnuz devices: vLLM's normalisation (0x80 -> 0, bits as fnuz, scales x2).
                 Other fp8 checkpoints (static, no or other blocks, e5m2) are refused by name.
  w4_linear.py   ``radiance_w4``: the same consumers in 4 bits (the project's layout, group 128),
                 quantised at load per TP shard from a bf16 or block-fp8 checkpoint (chunked), or
                 repacked from symmetric group-128 GPTQ; an Fp8Activation runs ``w4a8_gemm``, a
                 tensor ``w4a16_gemm``; ``Fp8Input(0, dtype)``. The install line counts the
                 consumers by GEMM ("consumers: 9 w4a8"). Asymmetric GPTQ, AWQ, MXFP4: refused.
  gdn.py         RADIANCE_GDN_NORM_QUANT=1 (off by default): on an installed contract, each GDN
                 layer whose guards hold (silu-gated RMSNormGated over whole heads, bf16
                 weight, out_proj declaring ``radiance_fp8_input``, ...) gets a per-instance
                 ``_output_projection``: ``gdn_norm_quant`` (norm + gate + fp8 quant, one
                 launch) hands out_proj an Fp8Activation. Refused layers stay stock; the install
                 line counts the epilogues and names each refusal once.
Kernels: radiance/kernels/add_rms_quant.py, allreduce_add_rms_quant.py, gdn_norm_quant.py,
fp8_gemm.py, quant_fp8.py (the consumers' quantiser for plain-tensor inputs).

Serving it: ``--quantization radiance_fp8`` (bf16 or block-fp8 checkpoint; or ``radiance_w4``) and
RADIANCE_FP8_STREAM=1, TP > 1. Consumers that qualify: full-attention qkv_proj, the GDN's
in_proj_qkvz + in_proj_ba (both under radiance_fp8, same format), dense-MLP gate_up_proj.
Checked end to end on vLLM CPU at TP=2, greedy tokens identical to the stock fp8 path:
tests/e2e/test_tiny_tp2.py (the trained tiny Qwen3.5, bf16 checkpoint quantised per token, through the
gateway) and test_fp8_stream_block_tp2.py (a tiny Qwen3-Next block-fp8 checkpoint, group 128); the
declines at TP=1 and on an all-MoE model in tests/e2e/test_fp8_stream_tp2.py.

Not done:
  * The sparse-MoE block: every published Qwen3-Next MLP is one; its router, experts and
    shared expert read the activation, and its all-reduce happens inside FusedMoE, so neither
    the post-attention epilogue (consumer) nor the deferred down (row) applies to it. Such
    sites decline in the plan, with the block named in the log line; on an all-MoE model the
    whole feature declines.
  * Block-fp8 routed experts: handed to vLLM's own Fp8MoEMethod (the MoE block declines
    anyway); not exercised on CPU, where the tiny checkpoint keeps its experts bf16.
  * Per-tensor / per-channel fp8 checkpoints (no weight_block_size): refused by name, not taken.
  * The GDN epilogue is off by default: it matches vLLM's CPU RMSNormGated in all but ~3e-6
    of the bf16 values (one ulp; fp8 codes ~1e-6..1e-7, scales exact), so the TP=2 e2e
    identity test could see a different token; not run end to end with it on.
  * A fused SiluAndMul + quant as the dense MLP's activation: none. One reproduced vLLM's
    native SiluAndMul, but on CPU vLLM runs its C++ silu_and_mul, whose bf16 outputs differ
    from the native ones almost everywhere (measured: fp8 codes of 99% of [*, 256] rows
    differ), so the contract would stop matching the stock fp8 path token for token; it left
    the product (its numbers: docs/benchmarks.md).
"""
