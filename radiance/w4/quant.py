"""Symmetric 4-bit weight quantiser: per output channel, per group of G along K, no zero point.

For every (row, group) the scale is ``f * amax / 7`` for the shrink factor ``f`` that gives the
least squared error, searched independently per (row, group) over ``SHRINK``. Two details
matter for accuracy:

* the scale is rounded to the dtype the kernel multiplies with (bf16/fp16) *before* codes are
  chosen, and the error is measured against that rounded scale, so the codes are the best
  ones for the scale that will actually be used;
* clipping: the extremes of a 128-weight sample are where it is thinnest, so spending the
  top level on them costs more in the middle than it saves at the tails; a smaller ``f``
  saturates a few outliers at -8/7 and resolves the bulk finer.

Everything runs in row chunks (``rows``), so a 248320 x 5120 lm_head is quantised with
O(rows * K) fp32 temporaries, never a whole-matrix fp32 copy.
"""
from __future__ import annotations

import torch

from ..kernels import w4_layout as layout

# 1.0 down to 0.525 in twenty steps; per (row, group) the best one wins. Twenty is where the
# round-trip error stops improving on Gaussian and Student-t weights (docs/benchmarks.md).
SHRINK: tuple[float, ...] = tuple(1.0 - 0.5 * i / 20 for i in range(20))
DEFAULT_ROWS = 4096
QMAX = 7


def default_scale_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """Scales in the weight's own 16-bit dtype (that is what the activations are in); bf16 for
    anything else (fp32 or fp8 checkpoints dequantised upstream)."""
    return weight_dtype if weight_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


def quantize_rows(w: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.bfloat16,
                  shrink: tuple[float, ...] = SHRINK) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [R, K]`` -> (codes int8 ``[R, K]`` in -8..7, scales ``[R, K // G]`` in ``scale_dtype``).

    Call it on a row chunk; ``quantize_pack`` does the chunking.
    """
    r, k = w.shape
    layout.check_group_size(k, group_size)
    if not shrink:
        raise ValueError("shrink needs at least one factor (1.0 is plain absmax)")
    ng = k // group_size
    w32 = w.float().view(r, ng, group_size)
    amax = w32.abs().amax(dim=-1)
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("weight contains inf or NaN; refusing to quantise it")
    smax = torch.finfo(scale_dtype).max
    best_err = best_q = best_s = None
    for f in shrink:
        s = (amax * (f / QMAX)).clamp_(max=smax).to(scale_dtype)
        s32 = s.float().unsqueeze(-1)
        # an all-zero group (vocab padding) has s == 0: codes 0, error 0
        q = torch.round(w32 / torch.where(s32 > 0, s32, torch.ones_like(s32))).clamp_(layout.CODE_MIN, layout.CODE_MAX)
        err = (q * s32 - w32).square_().sum(dim=-1)
        q = q.to(torch.int8)
        if best_err is None:
            best_err, best_q, best_s = err, q, s
            continue
        take = err < best_err
        best_err = torch.where(take, err, best_err)
        best_q = torch.where(take.unsqueeze(-1), q, best_q)
        best_s = torch.where(take, s, best_s)
        del q, err, s32, s, take
    return best_q.view(r, k), best_s


def quantize_pack(w: torch.Tensor, group_size: int = 128, scale_dtype: torch.dtype | None = None,
                  shrink: tuple[float, ...] = SHRINK, rows: int = DEFAULT_ROWS,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> (qweight int32, scales) in the packed layout (``radiance.kernels.w4_layout``),
    on ``w``'s device, ``rows`` output rows at a time."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got {tuple(w.shape)}")
    n, k = w.shape
    layout.check_group_size(k, group_size)
    sdt = default_scale_dtype(w.dtype) if scale_dtype is None else scale_dtype
    qshape, sshape = layout.packed_shapes(n, k, group_size)
    qweight = torch.empty(qshape, dtype=torch.int32, device=w.device)
    scales = torch.zeros(sshape, dtype=sdt, device=w.device)
    ng = k // group_size
    rows = max(layout.ROW_TILE, rows // layout.ROW_TILE * layout.ROW_TILE)  # whole row tiles
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        q, s = quantize_rows(w[r0:r1], group_size, sdt, shrink)
        qweight[r0 // layout.ROW_TILE: layout.row_tiles(r1)] = layout.pack_codes(q)
        scales[:ng, r0:r1] = s.t()
        del q, s
    return qweight, scales


def roundtrip_error(w: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, group_size: int,
                    rows: int = DEFAULT_ROWS) -> float:
    """``||W - deq(Q)|| / ||W||`` (Frobenius), chunked like the quantiser."""
    n, k = w.shape
    num = den = 0.0
    rows = max(layout.ROW_TILE, rows // layout.ROW_TILE * layout.ROW_TILE)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        ref = w[r0:r1].float()
        deq = layout.dequantize(qweight[r0 // layout.ROW_TILE: layout.row_tiles(r1)], scales[:, r0:r1], k,
                                group_size)
        num += float((deq - ref).square().sum())
        den += float(ref.square().sum())
    return (num / den) ** 0.5 if den > 0 else 0.0
