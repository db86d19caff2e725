"""Random weights for the tiny model, identical bytes for the same seed on every machine."""

from __future__ import annotations

import math
from pathlib import Path

from launcher.tinymodel import config

INIT_STD = 0.02


def random_state_dict(seed: int) -> dict:
    """Every tensor of ``config.tensor_layout()``; only torch's CPU generator, no global RNG state."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out = {}
    for name, shape, role in config.tensor_layout():
        if role in ("linear", "embed"):
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=gen)
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
