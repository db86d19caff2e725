"""fp8-stream: the fp8 residual-stream contract for Qwen3-Next at TP > 1.

Stock vLLM, at every RowParallel site (o_proj / out_proj / down_proj): all-reduce, then
GemmaRMSNorm(residual add), then the consuming fp8 linear quantises the normed activation
again. Here layers exchange ``(partial_sum, residual)``: a deferred site's all-reduce is
followed by ONE fused kernel, ``radiance.kernels.add_rms_quant`` (residual add + the norm
with its own weight + fp8 quant), whose ``(q, scale)`` goes straight into consumers that
take a pre-quantised input. The last layer keeps the stock contract (model.norm and the
drafter see what they see today).

Pieces:
  plan.py      the guards (all of the seed's) and per-site decisions, pure inspection
  contract.py  the decoder-layer forward under the contract; install / uninstall
  patch.py     ``PATCHES``: after vLLM loads a model, plan it, install or decline (one line)
Kernels: radiance/kernels/add_rms_quant.py, silu_mul_quant.py, fp8_gemm.py.

Not done yet -- until these exist every layer of a stock Qwen3-Next declines, with the
consumer named in the log line:
  1. A W8A8 linear method whose ``apply`` takes ``(q, scale)`` (``fp8_gemm.scaled_mm``) and
     declares ``radiance_fp8_input = Fp8Input(group, dtype)``: wraps vLLM's Fp8LinearMethod
     for fp8 checkpoints (128x128 block scales -> group 128 activations) and, for bf16
     checkpoints, quantises weights per output channel at load (per-token activations).
     Installed on qkv_proj, dense gate_up_proj / down_proj, and the GDN projections.
  2. A tuple-aware GDN forward (``QwenGatedDeltaNetAttention`` reads ``hidden_states.size(0)``
     and ``.dtype`` and feeds two projections), declaring ``radiance_fp8_input`` on the module.
  3. The sparse-MoE block: every Qwen3-Next MLP is one; its router, experts and shared
     expert read the activation, and its all-reduce happens inside FusedMoE, so neither the
     post-attention epilogue (consumer) nor the deferred down (row) applies to it yet.
  4. ``silu_mul_quant`` as the dense MLP's activation when down_proj takes (q, scale).
  5. The end-to-end check on vLLM CPU at TP=2 (tiny model with online fp8): epilogue count in
     the install log, greedy outputs against the stock fp8 path, the declines.
"""
