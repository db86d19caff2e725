"""Test-only: a speculative decoder that is not lossless -- every draft token is accepted.

Put on an engine's PYTHONPATH by tests/e2e/test_bench_cpu.py (and by a GPU run of `radiance bench
--engine-env PYTHONPATH=...`) to prove that the lossless check fails a real violation: vLLM's rejection
sampler is handed target logits in which each draft token wins its row, so a wrong draft is emitted as if
the target had chosen it. Both runners' samplers are planted (V1's on CPU and GPU; Model Runner V2's, which
vLLM picks on GPUs: without it a GPU engine on V2 ran unplanted and the control passed, H100 2026-12-06).
The production code has no such switch.
"""
import radiance.plugin as _plugin

_real_register = _plugin.register


def _v1(real):
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, *args, **kwargs):
        import torch

        rows = torch.arange(draft_token_ids.shape[0], device=target_logits.device)
        target_logits[rows, draft_token_ids.long()] = target_logits.max(dim=-1).values + 100.0
        return real(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                    target_logits, *args, **kwargs)
    return rejection_sample


def plant_v2_logits(target_logits, draft_sampled, cu_num_logits) -> None:
    """In place: row r of a request verifies the draft token in draft_sampled[r + 1] (V2's layout: each row's
    input token; a request's last row is its bonus). That token gets the row's max + 100, without a host sync."""
    import torch

    n = target_logits.shape[0]
    if n < 2:
        return
    nxt = draft_sampled[1:].long()
    last = torch.zeros(n, dtype=torch.bool, device=target_logits.device)
    last[(cu_num_logits[1:] - 1).long()] = True
    keep = ~last[:-1] & (nxt >= 0)
    rows = torch.arange(n - 1, device=target_logits.device)
    cols = nxt.clamp(min=0)
    target_logits[rows, cols] = torch.where(keep, target_logits[:-1].max(dim=-1).values + 100.0,
                                            target_logits[rows, cols])


def _v2(real):
    def rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, *args, **kwargs):
        plant_v2_logits(target_logits, draft_sampled, cu_num_logits)
        return real(target_logits, draft_logits, draft_sampled, cu_num_logits, *args, **kwargs)
    return rejection_sample


def _plant(module: str, wrap) -> None:
    """``module.rejection_sample`` (looked up by name at each call) replaced by ``wrap`` of it, once."""
    import importlib

    try:
        rs = importlib.import_module(module)
    except Exception:
        return
    if getattr(rs.rejection_sample, "_planted", False):
        return
    planted = wrap(rs.rejection_sample)
    planted._planted = True
    rs.rejection_sample = planted


def register():
    _real_register()
    _plant("vllm.v1.sample.rejection_sampler", _v1)
    _plant("vllm.v1.worker.gpu.spec_decode.rejection_sampler", _v2)


_plugin.register = register
