"""The packed 4-bit weight layout shared by the quantiser, the GEMM and both features.

A weight ``W`` of shape ``[N, K]`` (out_features x in_features) is stored as two tensors:

``qweight``: int32 ``[Np // 16, Kp // 128, 16, 16]`` with ``Np = N`` rounded up to 16 and
    ``Kp = K`` rounded up to 128. Element ``[t, b, r, j]`` is word ``j`` of the 128-wide K
    block ``b`` of row ``n = 16 t + r``: every (16-row tile, K block) pair is one contiguous
    1 KiB run, rows inside it 64 bytes apart. A word holds eight 4-bit codes; nibble ``i``
    (bits ``4i .. 4i+3``) is the code of ``k = 128 b + 16 i + j``. A code is offset binary:
    ``u = q + 8`` with ``q`` in ``-8 .. 7``. Padding (rows past ``N``, K past ``K``) is
    ``u = 8``, i.e. q = 0.

``scales``: ``[Kp // G, N]`` in the dtype the kernel multiplies with (bf16 for a bf16 model),
    group-major: the scale of row ``n``, group ``g`` (``k // G == g``) is ``scales[g, n]``.
    Groups past ``K`` hold 0. ``N`` is ``scales.shape[1]``.

so that ``W[n, k] = scales[k // G, n] * (u(n, k) - 8)``, symmetric, no zero point.

Why this order. The GEMM walks K in 128-wide blocks; a program loads a ``[BLOCK_N, 16]`` word
tile per block, which is ``BLOCK_N / 16`` contiguous 1 KiB runs (a plain row-major
``[N, K/8]`` would be ``BLOCK_N`` scattered 64-byte pieces, and HBM pays for every page
opened), vectorised 16-byte loads. Nibble ``i`` of every word in that tile *is* the
``[BLOCK_N, 16]`` operand slab for ``k in [128 b + 16 i, 128 b + 16 i + 16)``: one shift and
mask per slab, no shuffle or interleave in registers, one tensor-core dot per slab. Two words
adjacent in a row give the two K-adjacent codes that one 32-bit operand register of a
tensor-core fragment holds, so on CUDA a single ``prmt`` + ``lop3`` turns a pair of words into
a packed bf16x2/f16x2 pair (``w4a16_gemm`` does this in inline PTX). Offset binary is what
that trick needs: ``u`` is OR-ed into the mantissa of 128.0 (bf16) or 1024.0 (fp16) and the
constant is subtracted. Scales are group-major because one step needs the ``BLOCK_N`` scales
of one group, which are then contiguous.

Group sizes: ``G`` must be a multiple of 16 that divides 128 or is a multiple of 128 (16, 32,
64, 128, 256, ...), and ``K % G == 0``.

``pack``/``unpack`` are exact inverses on codes; both work on any device and on row chunks
whose starts are multiples of 16 (``pack`` of rows ``[r0, r1)`` is tiles
``[r0 // 16, ceil(r1 / 16))`` of ``pack`` of the whole matrix).
"""
from __future__ import annotations

import torch

KBLOCK = 128            # K per packed block (16 words of 8 nibbles)
WORDS_PER_KBLOCK = KBLOCK // 8
ROW_TILE = 16           # rows per contiguous tile
SLAB = 16               # K per nibble slab inside a block
CODE_MIN, CODE_MAX = -8, 7
CODE_BIAS = 8           # offset-binary bias: stored u = q + 8


def padded_k(k: int) -> int:
    return -(-k // KBLOCK) * KBLOCK


def row_tiles(n: int) -> int:
    return -(-n // ROW_TILE)


def check_group_size(k: int, group_size: int) -> None:
    """Raise ValueError unless ``group_size`` fits the layout and divides ``k``."""
    g = group_size
    if g <= 0 or g % SLAB or not (KBLOCK % g == 0 or g % KBLOCK == 0):
        raise ValueError(f"group size {g}: must be a multiple of {SLAB} that divides {KBLOCK} "
                         f"or is a multiple of {KBLOCK}")
    if k % g:
        raise ValueError(f"K={k} is not a multiple of the group size {g}")


def packed_shapes(n: int, k: int, group_size: int) -> tuple[tuple[int, ...], tuple[int, int]]:
    """(qweight shape, scales shape) for an ``[n, k]`` weight."""
    kp = padded_k(k)
    return (row_tiles(n), kp // KBLOCK, ROW_TILE, WORDS_PER_KBLOCK), (kp // group_size, n)


def pack_codes(q: torch.Tensor) -> torch.Tensor:
    """Codes ``q`` int8 ``[R, K]`` in -8..7 -> qweight int32 ``[ceil(R/16), Kp/128, 16, 16]``."""
    if q.dim() != 2:
        raise ValueError(f"codes must be 2-D, got {tuple(q.shape)}")
    r, k = q.shape
    kp = padded_k(k)
    rp = row_tiles(r) * ROW_TILE
    u = torch.full((rp, kp), CODE_BIAS, dtype=torch.int32, device=q.device)
    u[:r, :k] = q.to(torch.int32) + CODE_BIAS
    # [tile, row, block, nibble i, word j]: nibble i of word j is k = 128 b + 16 i + j
    u = u.view(rp // ROW_TILE, ROW_TILE, kp // KBLOCK, KBLOCK // SLAB, SLAB)
    words = torch.zeros((rp // ROW_TILE, ROW_TILE, kp // KBLOCK, SLAB), dtype=torch.int64, device=q.device)
    for i in range(KBLOCK // SLAB):
        words |= u[:, :, :, i, :].to(torch.int64) << (4 * i)
    # nibble 7 reaches bit 31: fold the unsigned 32-bit word into int32's two's complement
    # explicitly rather than rely on how a narrowing cast wraps
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).permute(0, 2, 1, 3).contiguous()


def unpack_codes(qweight: torch.Tensor, k: int, n: int | None = None) -> torch.Tensor:
    """qweight int32 ``[T, Kp/128, 16, 16]`` -> codes int8 ``[n, k]`` (n defaults to 16 T)."""
    t, nb, rt, wpb = qweight.shape
    kp = nb * KBLOCK
    n = t * rt if n is None else n
    if k > kp or n > t * rt:
        raise ValueError(f"[{n}, {k}] does not fit packed tiles {tuple(qweight.shape)}")
    words = qweight.permute(0, 2, 1, 3).reshape(t * rt, nb, 1, wpb)
    shifts = (4 * torch.arange(KBLOCK // SLAB, device=qweight.device, dtype=torch.int32)).view(1, 1, -1, 1)
    u = (words >> shifts) & 0xF
    return (u.reshape(t * rt, kp)[:n, :k] - CODE_BIAS).to(torch.int8)


def pack_scales(scales_rows: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """Row-major scales ``[R, K // G]`` -> group-major ``[Kp // G, R]`` (padding groups 0)."""
    r, ng = scales_rows.shape
    if ng != k // group_size:
        raise ValueError(f"scales have {ng} groups, K={k} / G={group_size} needs {k // group_size}")
    out = torch.zeros((padded_k(k) // group_size, r), dtype=scales_rows.dtype, device=scales_rows.device)
    out[:ng] = scales_rows.t()
    return out


def unpack_scales(scales: torch.Tensor, k: int, group_size: int) -> torch.Tensor:
    """Group-major ``[Kp // G, N]`` -> row-major ``[N, K // G]``."""
    return scales[: k // group_size].t().contiguous()


def pack(q: torch.Tensor, scales_rows: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes ``[N, K]``, row-major scales ``[N, K // G]``) -> (qweight, scales) in this layout."""
    check_group_size(q.shape[1], group_size)
    return pack_codes(q), pack_scales(scales_rows, q.shape[1], group_size)


def unpack(qweight: torch.Tensor, scales: torch.Tensor, k: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack``: (codes int8 ``[N, K]``, row-major scales ``[N, K // G]``)."""
    return unpack_codes(qweight, k, scales.shape[1]), unpack_scales(scales, k, group_size)


def infer_group_size(qweight: torch.Tensor, scales: torch.Tensor) -> int:
    """G from the two packed shapes (``Kp // G`` scale rows)."""
    kp = qweight.shape[1] * KBLOCK
    if scales.shape[0] == 0 or kp % scales.shape[0]:
        raise ValueError(f"scales {tuple(scales.shape)} do not match qweight {tuple(qweight.shape)}")
    return kp // scales.shape[0]


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, k: int, group_size: int,
               dtype: torch.dtype = torch.float32, rows: int = 8192) -> torch.Tensor:
    """``[N, K]`` weight in ``dtype`` (N = ``scales.shape[1]``), computed in fp32 (exact:
    |q| <= 8 times a bf16/fp16 scale has at most 14 significant bits), in row chunks so
    temporaries stay bounded."""
    n = scales.shape[1]
    rows = max(ROW_TILE, rows // ROW_TILE * ROW_TILE)
    out = torch.empty((n, k), dtype=dtype, device=qweight.device)
    s_all = scales[: k // group_size]
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        tiles = qweight[r0 // ROW_TILE: row_tiles(r1)]
        q = unpack_codes(tiles, k, r1 - r0).float().view(r1 - r0, k // group_size, group_size)
        s = s_all[:, r0:r1].t().float().unsqueeze(-1)
        out[r0:r1] = (q * s).view(r1 - r0, k).to(dtype)
    return out
