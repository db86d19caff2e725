"""Test-only: a speculative decoder that is not lossless -- every draft token is accepted.

Put on an engine's PYTHONPATH by tests/e2e/test_bench_cpu.py (and by a GPU run of `radiance bench
--engine-env PYTHONPATH=...`) to prove that the lossless check fails a real violation: vLLM's rejection
sampler is handed target logits in which each draft token wins its row, so a wrong draft is emitted as if
the target had chosen it. The production code has no such switch.
"""
import radiance.plugin as _plugin

_real_register = _plugin.register


def register():
    _real_register()
    try:
        from vllm.v1.sample import rejection_sampler as rs
    except Exception:
        return
    if getattr(rs.rejection_sample, "_planted", False):
        return
    real = rs.rejection_sample

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, *args, **kwargs):
        import torch

        rows = torch.arange(draft_token_ids.shape[0], device=target_logits.device)
        target_logits[rows, draft_token_ids.long()] = target_logits.max(dim=-1).values + 100.0
        return real(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                    target_logits, *args, **kwargs)

    rejection_sample._planted = True
    rs.rejection_sample = rejection_sample


_plugin.register = register
