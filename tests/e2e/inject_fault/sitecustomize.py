"""Test-only faults, each on one TP rank, in the engine's processes (loaded through PYTHONPATH by
tests/e2e/test_tiny_tp2.py's "fault" variant and nowhere else: the production code has no fault switch).

* E2E_DRAFT_FAULT_AFTER: dynamic-draft's depth policy raises after that many steps, in the engine core
  (the one scheduler every rank follows), where a bug in the policy would.
* E2E_FP8_FAULT_RANK / E2E_FP8_FAULT_AFTER: fp8-stream's epilogue past its all-reduce (residual add +
  RMSNorm + fp8 quant) raises on that rank after that many calls -- inside the contract, mid-forward.
* E2E_FUSED_AR_PLANT_RANK: the fused two-rank all-reduce op returns a sum one step off in one element on
  that rank -- what a wrong peer read would give -- so its load-time self-test must find it.
"""
import os

_DD_AFTER = os.environ.get("E2E_DRAFT_FAULT_AFTER")
_FP8_RANK = os.environ.get("E2E_FP8_FAULT_RANK")
_PLANT_RANK = os.environ.get("E2E_FUSED_AR_PLANT_RANK")


def _rank() -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def _fault_after(real, rank: int, after: int, what: str):
    calls = [0]

    def wrapped(*args, **kwargs):
        if _rank() == rank:
            calls[0] += 1
            if calls[0] > after:
                raise RuntimeError(f"injected fault (test) after {after} {what}")
        return real(*args, **kwargs)

    return wrapped


def _inject() -> None:
    if _DD_AFTER is not None:
        from radiance.draft import depth_policy

        real, calls = depth_policy.DepthPolicy.choose, [0]

        def choose(self, batch_size):
            calls[0] += 1
            if calls[0] > int(_DD_AFTER):
                raise RuntimeError(f"injected fault (test) after {_DD_AFTER} steps")
            return real(self, batch_size)

        depth_policy.DepthPolicy.choose = choose
    if _FP8_RANK is not None:
        from radiance.fp8_stream import contract

        contract._norm_quant = _fault_after(contract._norm_quant, int(_FP8_RANK),
                                            int(os.environ.get("E2E_FP8_FAULT_AFTER", "0")), "fp8-stream epilogues")
    if _PLANT_RANK is not None:
        from radiance.fp8_stream import fused_allreduce

        real_op = fused_allreduce._TP2_OP

        def planted(*args, **kwargs):
            q, scale, residual = real_op(*args, **kwargs)
            if _rank() == int(_PLANT_RANK):
                residual = residual.clone()
                flat = residual.view(-1)
                flat[0] = flat[0] + flat[0].abs().clamp_min(1.0)  # the sum off in one element
            return q, scale, residual

        fused_allreduce._TP2_OP = planted


if _DD_AFTER is not None or _FP8_RANK is not None or _PLANT_RANK is not None:
    import radiance.plugin as _plugin

    _real_register = _plugin.register

    def register():
        _real_register()
        _inject()

    _plugin.register = register
