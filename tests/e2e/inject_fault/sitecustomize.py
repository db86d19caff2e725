"""Test-only: make dynamic-draft's capture raise on one TP rank, after a number of draft slots.

Loaded through PYTHONPATH by tests/e2e/test_tiny_tp2.py (the "fault" variant) and nowhere else: the
production code has no fault switch. E2E_FAULT_RANK names the TP rank, E2E_FAULT_AFTER how many slots
it serves first. The wrapped function is the per-slot shard reduction the controller's exchange needs,
so the fault lands where a real kernel failure would: before the ranks exchange the slot's numbers.
"""
import os

_RANK = os.environ.get("E2E_FAULT_RANK")

if _RANK is not None:
    import radiance.plugin as _plugin

    _real_register = _plugin.register
    _AFTER = int(os.environ.get("E2E_FAULT_AFTER", "0"))

    def register():
        _real_register()
        try:
            from radiance.draft import patch_proposer
        except Exception:
            return
        real = patch_proposer.shard_stats
        calls = [0]

        def shard_stats(*args, **kwargs):
            from vllm.distributed import get_tensor_model_parallel_rank

            if get_tensor_model_parallel_rank() == int(_RANK):
                calls[0] += 1
                if calls[0] > _AFTER:
                    raise RuntimeError(f"injected fault (test) after {_AFTER} draft slots")
            return real(*args, **kwargs)

        patch_proposer.shard_stats = shard_stats

    _plugin.register = register
