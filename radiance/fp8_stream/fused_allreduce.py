"""Wiring of the fused two-rank all-reduce + add_rms_quant epilogue (the kernel and its symmetric
buffers: radiance/kernels/allreduce_add_rms_quant.py) into the fp8-stream contract.

Where it runs: the contract (contract.py) calls ``allreduce_epilogue`` at every streamed site. At
TP=2 on CUDA / ROCm tensors that is the registered op ``radiance::tp2_allreduce_add_rms_quant``
(opaque to torch.compile, recorded by CUDA graphs): it copies the rank's partial into this
process's symmetric buffer (one [M, K] copy, the GEMM's output cannot land there) and runs the
kernel, for M up to ``FUSED_MAX_M`` (decode and small prefill steps; larger blocks take
the separate path, where NCCL's ring wins). The buffers are made on the first call, in vLLM's
eager warm-up, before any graph is captured, and only once every rank of the group said it can
(peer access to the other GPU, symmetric memory importable; agreed over the group's CPU
communicator), so the ranks never disagree on the path. Anything else -- CPU tensors, TP != 2,
``RADIANCE_FP8_STREAM_FUSED_AR=0``, a failed set-up -- runs ``all_reduce`` then
``add_rms_quant``: the same bits (the kernel module's doc says why).
"""
from __future__ import annotations

import torch

from ..kernels.allreduce_add_rms_quant import WORLD, TwoRankAllReduceEpilogue
from ..kernels.fp8_common import scale_shape

FUSED_MAX_M = 256  # rows per site the one-shot path takes; each buffer is FUSED_MAX_M x K


# ---------------------------------------------------------------------------------------
# The contract's entry: fused at TP=2 on GPUs, the separate all-reduce + epilogue elsewhere.
# ---------------------------------------------------------------------------------------

_STATE: dict = {}  # (group name, K, dtype) -> TwoRankAllReduceEpilogue, or None (set-up refused)


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(x)


def _separate(partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
              group_size: int, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from ..kernels.add_rms_quant import add_rms_quant

    return add_rms_quant(_all_reduce(partial), residual, weight, eps, group_size, fp8_dtype)


def _group_agrees(ok: bool) -> bool:
    """True only if every rank of the TP group says ``ok`` (the CPU communicator, so no device
    collective is issued on a path that might not exist)."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=get_tp_group().cpu_group)
    return bool(flag.item())


def _epilogue_for(k: int, dtype: torch.dtype, device: torch.device):
    import logging

    from vllm.distributed import get_tp_group

    tp = get_tp_group()
    key = (tp.unique_name, k, dtype)
    if key in _STATE:
        return _STATE[key]
    log = logging.getLogger("radiance")
    peer_ok, why = False, ""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401

        peer = 1 - tp.rank_in_group
        peer_dev = tp.ranks[peer] % max(1, torch.cuda.device_count())
        peer_ok = tp.world_size == WORLD and torch.cuda.can_device_access_peer(device.index or 0, peer_dev)
        why = "" if peer_ok else "no peer access between the two GPUs"
    except Exception as exc:  # noqa: BLE001 - the separate path always works
        why = f"{type(exc).__name__}: {exc}"
    ep = None
    if _group_agrees(peer_ok):
        try:
            ep = TwoRankAllReduceEpilogue(FUSED_MAX_M, k, dtype, group=tp.device_group, device=device)
        except Exception as exc:  # noqa: BLE001
            why = f"symmetric buffers: {type(exc).__name__}: {exc}"
        if not _group_agrees(ep is not None):
            ep = None
    if ep is None:
        log.warning("radiance: fp8-stream: the fused two-rank all-reduce epilogue is off for K=%d "
                    "(%s); all-reduce then add_rms_quant", k, why or "another rank could not set it up")
    else:
        log.info("radiance: fp8-stream: fused two-rank all-reduce epilogue for K=%d (M <= %d)", k, FUSED_MAX_M)
    _STATE[key] = ep
    return ep


def _tp2_cuda(partial, residual, weight, eps: float, group_size: int, fp8_dtype: torch.dtype):
    m, k = partial.shape
    ep = _epilogue_for(k, partial.dtype, partial.device) if m <= FUSED_MAX_M else None
    if ep is None:
        return _separate(partial, residual, weight, eps, group_size, fp8_dtype)
    ep.partial(m).copy_(partial)
    return ep.epilogue(m, residual, weight, eps, group_size, fp8_dtype)


def _tp2_fake(partial, residual, weight, eps: float, group_size: int, fp8_dtype: torch.dtype):
    m, k = partial.shape
    return (partial.new_empty((m, k), dtype=fp8_dtype),
            partial.new_empty(scale_shape(m, k, group_size), dtype=torch.float32),
            torch.empty_like(partial))


def _register_op():
    from ..kernels.dispatch import register_library_op

    return register_library_op("tp2_allreduce_add_rms_quant", _separate, _tp2_cuda, _tp2_fake)


_TP2_OP = _register_op()


def allreduce_epilogue(partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       group_size: int, fp8_dtype: torch.dtype, fused: bool):
    """all_reduce(partial) + add_rms_quant: (q, scale, new residual). ``fused``: the two-rank op
    (the kernel on GPU tensors); else the separate path."""
    if partial.dim() != 2:
        partial = partial.reshape(-1, partial.shape[-1])
    if fused:
        return _TP2_OP(partial, residual, weight, float(eps), int(group_size), fp8_dtype)
    return _separate(partial, residual, weight, eps, group_size, fp8_dtype)
