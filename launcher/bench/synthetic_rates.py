"""Switching vLLM's synthetic acceptance inside one running engine, so that one engine start serves
every acceptance profile of a `radiance bench` run.

A 27B-shaped engine takes ~100 s to start on a warm H200 and the device time of a session is 30 min:
starting one per (set, profile) left most of a comparison unmeasured. The rates are a tensor the
rejection sampler reads at each step; this worker extension (vLLM's ``worker_extension_cls``, reached
through ``LLM.collective_rpc``) puts new ones there on every rank, converted the way vLLM converts
the configured ones.
"""
from __future__ import annotations

METHOD = "radiance_bench_synthetic_rates"
EXTENSION = f"{__name__}.SyntheticRatesExtension"


class SyntheticRatesExtension:
    """Mixed into vLLM's GPU worker by vLLM when the engine is started with ``--worker-extension-cls``."""

    def radiance_bench_synthetic_rates(self, rates: list[float]) -> int:
        import torch
        from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates

        sampler = self.model_runner.rejection_sampler
        current = getattr(sampler, "synthetic_conditional_rates", None)
        if current is None:
            raise RuntimeError("the engine was not started with rejection_sample_method synthetic")
        k = current.numel()
        if len(rates) < k:
            raise ValueError(f"{len(rates)} acceptance rates for {k} draft positions")
        # a new tensor, not an in-place write: a patch that keeps per-depth copies sees the change by identity
        sampler.synthetic_conditional_rates = torch.tensor(
            unconditional_to_conditional_rates(list(rates[:k])), dtype=torch.float32, device=current.device)
        return k


def with_extension(server_args: list[str]) -> list[str]:
    """The engine's flags with the extension named (the profile names none: bench flags never serve)."""
    if "--worker-extension-cls" in server_args:
        raise ValueError("the profile already names a --worker-extension-cls")
    return [*server_args, "--worker-extension-cls", EXTENSION]
