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

Before the contract uses it, the op proves itself on the ranks it will serve (``prove``, at load, on
every rank of the group together): peer access and the buffers as above, then the op's result on a
known tensor against the TP group's own all-reduce (NCCL; gloo on CPU) followed by ``add_rms_quant``,
bit for bit. On any difference, on any rank, the ranks' verdicts are gathered and it is off on every
rank, with one line naming the ranks and what differed. On CPU there is no two-rank kernel: the op
runs the separate path, so the check proves the agreement and the latch, not a kernel (radiance check
says the kernel is unverified until it has run on two GPUs).
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


# (group, K, dtype, group size, fp8 dtype) -> (proven, why not): a re-plan around taps reuses the verdict
_PROVEN: dict = {}
PROVE_ROWS = (1, 5, 64)  # decode, an odd block, a prefill-sized block: every M the check runs


def _known_inputs(rank: int, m: int, k: int, dtype: torch.dtype, device: torch.device):
    """A partial that differs per rank, and the residual every rank holds alike."""
    g = torch.Generator().manual_seed(7919 * (rank + 1) + m)  # on the host: the same numbers on any device
    partial = torch.randn(m, k, generator=g, device="cpu").to(dtype)
    residual = torch.randn(m, k, generator=torch.Generator().manual_seed(104729 + m), device="cpu").to(dtype)
    return partial.to(device), residual.to(device)


def _differences(got, want) -> str:
    """'' when the op's (q, scale, residual) equals the reference's bit for bit, else what differs."""
    names = ("fp8 codes", "scales", "sum (new residual)")
    out = []
    for name, a, b in zip(names, got, want):
        if a.shape != b.shape:
            out.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
            continue
        if a.dtype.is_floating_point and a.element_size() == 1:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        n = int((a != b).sum())
        if n:
            out.append(f"{name}: {n} of {a.numel()} differ")
    return ", ".join(out)


def prove(weight: torch.Tensor | None, eps: float, group_size: int, fp8_dtype: torch.dtype,
          dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """Called on every rank of the TP=2 group together, at load (``weight`` None: this rank installed no
    stream, it only votes). (True, "") when the fused op is proven on these ranks; else (False, one line:
    which ranks, why). On GPUs the op is the kernel (peer access and buffers first); on CPU the separate
    path it dispatches to there."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    tp = get_tp_group()
    k = int(weight.shape[-1]) if weight is not None else 0
    key = (tp.unique_name, k, dtype, group_size, fp8_dtype)
    if key in _PROVEN:
        return _PROVEN[key]
    backend = "NCCL" if device.type == "cuda" else "gloo"
    why = "" if weight is not None else "the stream is not installed on this rank"
    inputs = []
    if not why:
        try:
            inputs = [_known_inputs(tp.rank_in_group, m, k, dtype, device) for m in PROVE_ROWS]
        except Exception as exc:  # noqa: BLE001 - a check that cannot run proves nothing
            why = f"the check's inputs: {type(exc).__name__}: {exc}"
    ready = _group_agrees(not why)  # every rank takes the same collectives from here
    if ready and device.type == "cuda":
        if _epilogue_for(k, dtype, device) is None:  # peer access and buffers, agreed by the group
            why = "no peer access between the two GPUs, or no symmetric buffers (the line above says which)"
    if ready and _group_agrees(not why):
        from ..kernels.add_rms_quant import add_rms_quant

        # Every rank runs every M's two collectives, whatever it found before: a rank that stopped at its
        # first difference would leave its peer waiting in the next all-reduce.
        for m, (partial, residual) in zip(PROVE_ROWS, inputs):
            reduced = _all_reduce(partial.clone())
            got = _TP2_OP(partial.clone(), residual.clone(), weight, float(eps), int(group_size), fp8_dtype)
            if why:
                continue
            try:
                diff = _differences(got, add_rms_quant(reduced, residual.clone(), weight, eps, group_size,
                                                       fp8_dtype))
            except Exception as exc:  # noqa: BLE001
                diff = f"the comparison raised {type(exc).__name__}: {exc}"
            if diff:
                why = f"M={m}: {diff} against {backend}'s all-reduce + add_rms_quant"
    verdicts: list = [None] * tp.world_size
    dist.all_gather_object(verdicts, why, group=tp.cpu_group)
    bad = [(r, w) for r, w in enumerate(verdicts) if w]
    result = (False, "; ".join(f"rank {r}: {w}" for r, w in bad)) if bad else (True, "")
    if bad:
        _STATE[(tp.unique_name, k, dtype)] = None  # the op, if called at all, takes the separate path
    _PROVEN[key] = result
    return result


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
