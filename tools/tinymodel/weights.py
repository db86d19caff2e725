"""Random weights for the tiny model, identical bytes for the same seed on every machine.

The default model is the plain random init. Two options shape a variant for numerics tests that
compare two serving paths token for token (the fp8-stream e2e): random greedy decoding is
chaotic -- the top two of 4096 random logits are often within a bf16 ulp of each other -- so a
perturbation of one fp8 code somewhere can flip a token and everything after it.

* ``embed_scale`` multiplies the token embeddings. The residual stream then carries mostly the
  current token's embedding, and the layers (whose outputs have a fixed scale) decide a smaller
  share of each logit: a given hidden-state perturbation moves the logits proportionally less
  against the same top-1 margins, so greedy choices are decisive. Scaling lm_head or model.norm
  would not: margins and the perturbation's effect on the logits scale together.
* ``norm_std`` draws the Gemma-style norm offsets from N(0, norm_std) instead of zeros, so every
  RMSNorm has its own weight and a path that applied the wrong norm's weight shows up.
"""

from __future__ import annotations

import math
from pathlib import Path

from tools.tinymodel import config

INIT_STD = 0.02


def random_state_dict(seed: int, mlp_only_layers=(), embed_scale: float = 1.0,
                      norm_std: float = 0.0, arch: config.Arch = config.QWEN3_NEXT) -> dict:
    """Every tensor of ``config.tensor_layout(mlp_only_layers, arch)``; only torch's CPU generator,
    no global RNG state."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out = {}
    for name, shape, role in config.tensor_layout(mlp_only_layers, arch):
        if role in ("linear", "embed"):
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)
            if role == "embed" and embed_scale != 1.0:
                t = t * embed_scale
        elif role == "zero_norm" and norm_std:
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, norm_std, generator=gen)
        elif role == "conv":
            # Fan-in of a depthwise causal conv is the kernel width.
            bound = 1.0 / math.sqrt(shape[-1])
            t = torch.empty(shape, dtype=torch.float32).uniform_(-bound, bound, generator=gen)
        elif role == "zero_norm":
            t = torch.zeros(shape, dtype=torch.float32)
        elif role == "one_norm":
            t = torch.ones(shape, dtype=torch.float32)
        elif role == "a_log":
            # Decay rates A in [1, 16], as in the published GDN initialisation.
            t = torch.empty(shape, dtype=torch.float32).uniform_(1.0, 16.0, generator=gen).log()
        elif role == "dt_bias":
            # Inverse softplus of dt drawn log-uniformly in [1e-3, 1e-1].
            u = torch.empty(shape, dtype=torch.float32).uniform_(0.0, 1.0, generator=gen)
            dt = torch.exp(u * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            t = dt + torch.log(-torch.expm1(-dt))
        else:
            raise ValueError(f"unknown tensor role {role!r} for {name}")
        out[name] = to_storage_dtype(name, role, t)
    return out


def to_storage_dtype(name: str, role: str, tensor):
    """bf16 everywhere except A_log, which vLLM keeps (and the published checkpoints store) in fp32."""
    import torch

    dtype = torch.float32 if role == "a_log" else torch.bfloat16
    return tensor.to(dtype).contiguous()


def save(state_dict: dict, out_dir: Path, metadata: dict[str, str] | None = None) -> Path:
    from safetensors.torch import save_file

    path = out_dir / "model.safetensors"
    save_file(state_dict, str(path), metadata={"format": "pt", **(metadata or {})})
    return path
