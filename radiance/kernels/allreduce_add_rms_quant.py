"""One-shot all-reduce + residual add + RMSNorm + fp8 quant for two ranks, in one Triton kernel.

At TP=2 a deferred RowParallel site runs ``all_reduce(partial)`` (NCCL) and then
``add_rms_quant``: two launches and a round trip through HBM for a [M, K] block that, at decode
sizes (M <= 64), is a few hundred kB. Here each rank's GEMM leaves its partial sum in a torch
symmetric-memory buffer; after one cross-rank barrier, every rank runs the same kernel that
reads *both* partials (its own locally, its peer's over NVLink through the peer mapping), adds
them, and does the epilogue of ``radiance.kernels.add_rms_quant`` on the sum. No NVLink
multicast (multimem) is used: only plain peer loads, so it runs with
TORCH_SYMM_MEM_DISABLE_MULTICAST=1.

Exactness against ``all_reduce`` + the reference epilogue: NCCL's bf16 sum of two operands is
one correctly rounded add; the kernel adds in fp32 (exact for two bf16 values within 2**16 of
each other's magnitude, and a far smaller addend cannot move the bf16 rounding) and rounds once
to bf16, always in rank order (p0 + p1), so both ranks get the same bits, which are NCCL's.
From there the arithmetic is add_rms_quant's, helper for helper.

Buffer reuse: the partials live in two symmetric buffers used alternately. Before a site, the
barrier waits for the peer's partial; a buffer is rewritten two sites later, after the next
barrier, which the peer can only pass once its kernel on that buffer is done (stream order).
So one barrier per site, not two.

The op, ``torch.ops.radiance.allreduce_add_rms_quant(p0, p1, residual, weight, eps, group_size,
fp8_dtype)``, is the kernel on the two partials given as tensors (the peer's as its mapped view; on CPU
tensors the reference). The cross-rank half cannot be an op argument: a schema carries tensors, scalars,
dtypes and devices, not the process group the buffers are made over nor the symmetric-memory handle whose
barrier must run before each site. ``TwoRankAllReduceEpilogue`` holds those and, after the barrier, runs
the op's GPU path (it lives on GPUs only, inside the op of a site). The fp8-stream patch wires it into
vLLM (radiance/fp8_stream/fused_allreduce.py: the TP group, the agreement between ranks, and the op
recorded at each site, which finds its buffers by vLLM's TP group).
"""
from __future__ import annotations

import torch

from . import fp8_common as fc
from .add_rms_quant import add_rms_quant_reference
from .dispatch import eager_gpu_call, fp8_dtype_for_device, register_library_op

try:  # Triton is optional: the reference runs everywhere.
    import triton
    import triton.language as tl

    from .add_rms_quant import norm_quant_row
    from .fp8_common import round_to
except ImportError:  # pragma: no cover - CPU images without Triton
    triton = None
    tl = None

WORLD = 2


def allreduce_add_rms_quant_reference(partials: list[torch.Tensor], residual: torch.Tensor,
                                      weight: torch.Tensor, eps: float, group_size: int = 0,
                                      fp8_dtype: torch.dtype | None = None):
    """What NCCL's all-reduce followed by the reference epilogue computes, from the ranks'
    partial sums in rank order."""
    if len(partials) != WORLD:
        raise ValueError(f"two partial sums expected, got {len(partials)}")
    y = (partials[0].float() + partials[1].float()).to(partials[0].dtype)
    return add_rms_quant_reference(y, residual, weight, eps, group_size, fp8_dtype)


if triton is not None:

    @triton.jit
    def _sum_add_part(p0_ptr, p1_ptr, r_ptr, ro_ptr, row, K, OFF: tl.constexpr,
                      BLOCK: tl.constexpr):
        """s = round(p0 + p1) + r over [OFF, OFF + BLOCK) in fp32; stores the new residual."""
        cols = OFF + tl.arange(0, BLOCK)
        mask = cols < K
        # volatile: the peer wrote these bytes; never serve them from a stale L1 line
        a = tl.load(p0_ptr + row * K + cols, mask=mask, other=0.0, volatile=True)
        b = tl.load(p1_ptr + row * K + cols, mask=mask, other=0.0, volatile=True)
        y = round_to(a.to(tl.float32) + b.to(tl.float32), p0_ptr.dtype.element_ty)
        r = tl.load(r_ptr + row * K + cols, mask=mask, other=0.0)
        s = y.to(tl.float32) + r.to(tl.float32)
        tl.store(ro_ptr + row * K + cols, round_to(s, ro_ptr.dtype.element_ty), mask=mask)
        return s

    @triton.jit
    def _allreduce_add_rms_quant_kernel(p0_ptr, p1_ptr, r_ptr, w_ptr, q_ptr, s_ptr, ro_ptr, K,
                                        eps, FMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                                        GROUP: tl.constexpr, FNUZ: tl.constexpr,
                                        BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                                        LOG2: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        act: tl.constexpr = p0_ptr.dtype.element_ty
        sa = _sum_add_part(p0_ptr, p1_ptr, r_ptr, ro_ptr, row, K, 0, BLOCK_A)
        sb = sa  # placeholder when there is no second part (never read)
        if BLOCK_B > 0:
            sb = _sum_add_part(p0_ptr, p1_ptr, r_ptr, ro_ptr, row, K, BLOCK_A, BLOCK_B)
        norm_quant_row(sa, sb, row, w_ptr, q_ptr, s_ptr, K, eps, FMAX, MIN_SCALE, GROUP, FNUZ,
                        BLOCK_A, BLOCK_B, LOG2, act)


def allreduce_add_rms_quant_triton(p0: torch.Tensor, p1: torch.Tensor, residual: torch.Tensor,
                                   weight: torch.Tensor, eps: float, group_size: int = 0,
                                   fp8_dtype: torch.dtype | None = None):
    """The kernel on two [M, K] partials given as tensors (a peer view from symmetric memory,
    or, for tests, two local tensors): (q, scale, new_residual)."""
    if triton is None:
        raise RuntimeError("the fused all-reduce epilogue needs triton")
    fp8_dtype = fc.resolve_fp8_dtype(fp8_dtype, residual.device)
    m, k = residual.shape
    fc.check_group(group_size, k)
    if p0.shape != (m, k) or p1.shape != (m, k) or p0.stride(-1) != 1 or p1.stride(-1) != 1:
        raise ValueError("partials must be contiguous [M, K] like the residual")
    residual = residual.contiguous()
    weight = weight.contiguous()
    dev = residual.device
    q = torch.empty((m, k), dtype=fp8_dtype, device=dev)
    scale = torch.empty(fc.scale_shape(m, k, group_size), dtype=torch.float32, device=dev)
    new_residual = torch.empty((m, k), dtype=p0.dtype, device=dev)
    if m == 0:
        return q, scale, new_residual
    block_a, block_b, log2, num_warps = fc.launch_params(k)
    _allreduce_add_rms_quant_kernel[(m,)](
        p0, p1, residual, weight, q.view(torch.uint8), scale, new_residual, k, float(eps),
        BLOCK_A=block_a, BLOCK_B=block_b, LOG2=log2, num_warps=num_warps, enable_fp_fusion=False,
        **fc.quant_constexprs(group_size, fp8_dtype))
    return q, scale, new_residual


def _allreduce_add_rms_quant_gpu(p0: torch.Tensor, p1: torch.Tensor, residual: torch.Tensor,
                                  weight: torch.Tensor, eps: float, group_size: int, fp8_dtype: torch.dtype
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if triton is None:
        return allreduce_add_rms_quant_reference([p0, p1], residual, weight, eps, group_size, fp8_dtype)
    return allreduce_add_rms_quant_triton(p0, p1, residual, weight, eps, group_size, fp8_dtype)


def _allreduce_add_rms_quant_cpu(p0: torch.Tensor, p1: torch.Tensor, residual: torch.Tensor,
                                  weight: torch.Tensor, eps: float, group_size: int, fp8_dtype: torch.dtype
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return allreduce_add_rms_quant_reference([p0, p1], residual, weight, eps, group_size, fp8_dtype)


def _allreduce_add_rms_quant_fake(p0, p1, residual, weight, eps, group_size, fp8_dtype):
    m, k = residual.shape
    fc.check_group(group_size, k)
    return (residual.new_empty((m, k), dtype=fp8_dtype),
            residual.new_empty(fc.scale_shape(m, k, group_size), dtype=torch.float32),
            p0.new_empty((m, k)))


_OP = register_library_op("allreduce_add_rms_quant", _allreduce_add_rms_quant_cpu,
                          _allreduce_add_rms_quant_gpu, _allreduce_add_rms_quant_fake)


def allreduce_add_rms_quant(p0: torch.Tensor, p1: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float, group_size: int = 0, fp8_dtype: torch.dtype | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, new_residual) of add_rms_quant(round(p0 + p1), ...), the partials in rank order. Eager
    calls on plain GPU tensors go straight to the kernel; traced, fake and CPU calls go through the op."""
    if fp8_dtype is None:
        fp8_dtype = fp8_dtype_for_device(residual.device)
    if eager_gpu_call(p0, p1, residual, weight):
        return allreduce_add_rms_quant_triton(p0, p1, residual, weight, float(eps), int(group_size), fp8_dtype)
    return _OP(p0, p1, residual, weight, float(eps), int(group_size), fp8_dtype)


class TwoRankAllReduceEpilogue:
    """Symmetric partial-sum buffers of up to [max_m, K] for one process group of two ranks.

    Per site: write the partial into ``partial(m)``, then call ``epilogue(m, residual, ...)``.
    """

    def __init__(self, max_m: int, k: int, dtype: torch.dtype = torch.bfloat16,
                 group=None, device: torch.device | None = None):
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        group = group or dist.group.WORLD
        if dist.get_world_size(group) != WORLD:
            raise ValueError("the one-shot epilogue is written for exactly two ranks")
        self.rank = dist.get_rank(group)
        self.max_m, self.k, self.dtype = max_m, k, dtype
        device = device or torch.device("cuda", torch.cuda.current_device())
        name = group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed by older torch, a no-op or absent on newer
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable(name)
        self._bufs, self._handles = [], []
        for _ in range(2):
            buf = symm_mem.empty(max_m, k, dtype=dtype, device=device)
            self._bufs.append(buf)
            self._handles.append(symm_mem.rendezvous(buf, name))
        # both ranks' views of each slot, rank order; sliced per call, never re-mapped
        self._views = [[h.get_buffer(r, (max_m, k), dtype) for r in range(WORLD)]
                       for h in self._handles]
        self.slot = 0

    def partial(self, m: int) -> torch.Tensor:
        """This rank's [m, K] buffer for the current site."""
        return self._bufs[self.slot][:m]

    def epilogue(self, m: int, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 group_size: int = 0, fp8_dtype: torch.dtype | None = None):
        if m > self.max_m:
            raise ValueError(f"M={m} exceeds the buffers' {self.max_m} rows")
        self._handles[self.slot].barrier(channel=0)
        p0, p1 = (v[:m] for v in self._views[self.slot])
        # the kernel itself: this runs inside the site's op (fp8-stream's), whose dispatch is paid
        out = allreduce_add_rms_quant_triton(p0, p1, residual, weight, eps, group_size, fp8_dtype)
        self.slot ^= 1
        return out


def _register_aot() -> None:
    """The per-rank launches of the fp8-stream profiles (hidden 5120, both activation-scale modes,
    the device's fp8 format), so `python -m radiance.kernels.aot` proves they build for
    gfx1201/gfx942 and an image ships them compiled: planned by calling the launcher above with
    CPU tensors (radiance.kernels.aot)."""
    if triton is None:
        return
    import functools

    from . import aot, shipped

    def call(k: int, group: int, fp8_dtype: torch.dtype) -> None:
        p0 = torch.empty((1, k), dtype=torch.bfloat16)
        allreduce_add_rms_quant_triton(p0, torch.empty_like(p0), torch.empty_like(p0),
                                       torch.empty(k, dtype=torch.bfloat16), 1e-6, group, fp8_dtype)

    def launches(dev, arch):
        if not dev.has_fp8:  # radiance_fp8, and so fp8-stream, needs sm_89+ on NVIDIA
            return
        k = shipped.FP8_HIDDEN
        for group in shipped.FP8_GROUPS:
            yield f"K={k} group={group}", functools.partial(call, k, group, dev.fp8_dtype)

    aot.register("allreduce_add_rms_quant", "fp8_stream", launches)


_register_aot()
