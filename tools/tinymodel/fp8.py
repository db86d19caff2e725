"""A block-fp8 variant of the tiny model: the DeepSeek / Qwen FP8 checkpoint format.

Published Qwen3-Next FP8 checkpoints store a converted linear as ``W.weight`` float8_e4m3fn
``[N, K]`` plus ``W.weight_scale_inv`` fp32 ``[ceil(N/128), ceil(K/128)]`` (the dequant
multiplier of each 128x128 block), and say so in config.json::

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "modules_to_not_convert": [...]}

Which linears are converted here: those a TP=2 server can load in blocks -- every TP shard of
a column-parallel weight a whole number of 128-row blocks, every shard of a row-parallel weight
a whole number of 128-column blocks (vLLM refuses anything else, ``validate_fp8_block_shape``),
and the members of a fused module (q/k/v, gate/up) all or none. At the tiny sizes that leaves in
bf16, listed in ``modules_to_not_convert``: the full-attention q/k/v (k and v have 128 rows, 64
per rank), the GDN ``in_proj_ba`` (8 rows; the published checkpoints keep it too), the MoE
router and shared-expert gates (as published), the routed experts (vLLM's fp8 MoE kernels do
not run on CPU) and ``lm_head`` / ``mtp.fc``.

Stdlib at import; torch only inside the functions (the launcher imports the package).
"""

from __future__ import annotations

BLOCK = 128
TP_ALIGN = 2  # the checkpoint must load at this tensor-parallel size
SCALE_SUFFIX = ".weight_scale_inv"
# Row-parallel linears: TP splits their input (K); everything else here splits N.
_ROW_PARALLEL = (".o_proj", ".out_proj", ".down_proj")
# Fused by vLLM at load: one method per group, so the members convert together.
_FUSED = {"q_proj": ("q_proj", "k_proj", "v_proj"), "k_proj": ("q_proj", "k_proj", "v_proj"),
          "v_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj"),
          "up_proj": ("gate_proj", "up_proj"),
          # Qwen3.5's separately stored GDN projections (vLLM: in_proj_qkvz, in_proj_ba)
          "in_proj_qkv": ("in_proj_qkv", "in_proj_z"), "in_proj_z": ("in_proj_qkv", "in_proj_z"),
          "in_proj_b": ("in_proj_b", "in_proj_a"), "in_proj_a": ("in_proj_b", "in_proj_a")}
_NEVER = (".mlp.gate", ".shared_expert_gate", "lm_head", "mtp.fc")


def _module(name: str) -> str:
    return name[: -len(".weight")]


def _block_aligned(module: str, shape: tuple[int, ...]) -> bool:
    n, k = shape
    if module.endswith(_ROW_PARALLEL):
        return k % (BLOCK * TP_ALIGN) == 0
    return n % (BLOCK * TP_ALIGN) == 0 and k % BLOCK == 0


def converted_modules(layout) -> tuple[set[str], list[str]]:
    """``layout``: ``config.tensor_layout(...)`` rows. Returns (modules stored as block fp8,
    the sorted ``modules_to_not_convert`` list: every other linear, experts as their module)."""
    shapes = {_module(name): shape for name, shape, role in layout
              if role == "linear" and name.endswith(".weight")}
    ok = {m for m, shape in shapes.items()
          if not m.endswith(_NEVER) and ".mlp.experts." not in m and _block_aligned(m, shape)}
    for m in list(ok):
        parent, _, leaf = m.rpartition(".")
        if any(f"{parent}.{member}" not in ok for member in _FUSED.get(leaf, ())):
            ok.discard(m)
    kept = set()
    for m in shapes:
        if m in ok:
            continue
        # vLLM asks about the routed experts once, by the FusedMoE module's prefix.
        kept.add(m.split(".mlp.experts.")[0] + ".mlp.experts" if ".mlp.experts." in m else m)
    return ok, sorted(kept)


def quantize_blocks(weight, block: int = BLOCK):
    """``weight [N, K]`` -> (float8_e4m3fn codes [N, K], fp32 scale_inv [ceil(N/b), ceil(K/b)]):
    per block ``scale_inv = amax / 448``, codes ``round(w / scale_inv)`` -- the usual converter."""
    import torch

    n, k = weight.shape
    nb, kb = -(-n // block), -(-k // block)
    w = torch.zeros(nb * block, kb * block, dtype=torch.float32)
    w[:n, :k] = weight.float()
    tiles = w.view(nb, block, kb, block)
    amax = tiles.abs().amax(dim=(1, 3))
    fmax = torch.finfo(torch.float8_e4m3fn).max
    scale_inv = (amax / fmax).clamp(min=torch.finfo(torch.float32).tiny)
    q = (tiles / scale_inv[:, None, :, None]).clamp(-fmax, fmax).to(torch.float8_e4m3fn)
    return q.view(nb * block, kb * block)[:n, :k].contiguous(), scale_inv.contiguous()


def quantization_config(not_converted: list[str]) -> dict:
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": list(not_converted)}


def convert(state_dict: dict, layout) -> tuple[dict, dict]:
    """A bf16 state dict -> (the block-fp8 state dict, its ``quantization_config``)."""
    ok, kept = converted_modules(layout)
    out = {}
    for name, tensor in state_dict.items():
        if name.endswith(".weight") and _module(name) in ok:
            q, scale_inv = quantize_blocks(tensor)
            out[name] = q
            out[_module(name) + SCALE_SUFFIX] = scale_inv
        else:
            out[name] = tensor
    return out, quantization_config(kept)
