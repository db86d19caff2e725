"""What `radiance bench` asks of vLLM's GPU worker that vLLM has no call for, through a worker extension
(vLLM's ``worker_extension_cls``, reached with ``LLM.collective_rpc`` on every rank).

- Switching the synthetic acceptance inside one running engine, so that one engine start serves every
  acceptance profile of a run: a 27B-shaped engine takes ~100 s to start and a session's device time is
  30 min. The rates are a tensor the rejection sampler reads at each step; new ones go there, converted the
  way vLLM converts the configured ones.
- ``--take-turns``: an engine put to sleep at vLLM's level 2 (its weights dropped, not parked in host memory:
  two parked 27B engines are ~102 GiB, more than the device machines' host has; the nineteenth session's
  engines were killed by the host's OOM killer) gets its weights back on waking by drawing them again the
  way vLLM's dummy loader drew them at load. vLLM 0.32 itself keeps the buffers of the target and of its
  speculator over a level-2 sleep (``Worker.sleep``: where int4-head and w4-drafter keep their packed
  weights); an integer parameter it does not keep, and it cannot be drawn: those are kept here.
"""
from __future__ import annotations

RATES = "radiance_bench_synthetic_rates"
KEEP = "radiance_bench_keep_before_sleep"
REDRAW = "radiance_bench_redraw_weights"
EXTENSION = f"{__name__}.BenchWorkerExtension"


def _parameters(runner):
    """(tag, name, parameter) of the target and of its speculator's own module, as vLLM's sleep mode sees them:
    both runners answer ``get_draft_model`` (None without a speculator), and vLLM keeps that module's buffers
    over a level-2 sleep. A parameter the two share comes once under each tag."""
    for tag, model in (("target", runner.get_model()), ("draft", runner.get_draft_model())):
        if model is not None:
            for name, p in model.named_parameters():
                yield tag, name, p


class BenchWorkerExtension:
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

    def radiance_bench_keep_before_sleep(self) -> int:
        """Before a level-2 sleep, to host memory: every integer parameter of the target and its speculator
        (packed weights, indices: garbage after a wake, where an index may point anywhere). Returns how many."""
        import torch

        kept, seen = {}, set()
        for tag, name, p in _parameters(self.model_runner):
            if not torch.is_floating_point(p) and id(p) not in seen:
                seen.add(id(p))
                kept[(tag, name)] = p.detach().cpu().clone()
        self._radiance_kept = kept
        return len(kept)

    def radiance_bench_redraw_weights(self) -> int:
        """After waking from a level-2 sleep: every floating-point parameter of the target and its
        speculator drawn again as vLLM's dummy loader draws it (uniform in +-1e-3, or the parameter's own
        dummy value), and what was kept before the sleep put back. Returns the number of parameters drawn."""
        import torch
        from vllm.model_executor.model_loader.weight_utils import initialize_single_dummy_weight

        kept = getattr(self, "_radiance_kept", {})
        seen: set[int] = set()
        with torch.no_grad():
            for tag, name, p in _parameters(self.model_runner):
                if (tag, name) in kept:
                    p.copy_(kept[(tag, name)])
                elif id(p) not in seen and torch.is_floating_point(p):
                    seen.add(id(p))
                    initialize_single_dummy_weight(p)
        self._radiance_kept = {}
        return len(seen)


def with_extension(server_args: list[str]) -> list[str]:
    """The engine's flags with the extension named (the profile names none: bench flags never serve)."""
    if "--worker-extension-cls" in server_args:
        raise ValueError("the profile already names a --worker-extension-cls")
    return [*server_args, "--worker-extension-cls", EXTENSION]
