"""Per request: the most recent earlier occurrence of its trailing n-gram, and what followed it.

For row b with context ``ctx[b, :n_b]`` the trailing n-gram is ``ctx[b, n_b-ngram : n_b]``. The
match is the largest start ``p < n_b - ngram`` with ``ctx[b, p : p+ngram]`` equal to it; the
continuation is ``ctx[b, p+ngram : p+ngram+k]`` clipped at ``n_b``, so its length is
``min(k, n_b - p - ngram)``. No match (or ``n_b <= ngram``) gives length 0. Entries of ``cont``
past the length are -1.

The dynamic-draft controller takes this continuation as a free draft tail where the drafter's own
guess agrees with it. Most recent, not longest: on repetitive code and JSON the latest repeat is
the one whose next tokens are most likely to recur.

The Triton kernel gives each row one program that scans candidate starts backwards in blocks
and stops at the first block holding a match, so the common repetitive case touches one block
and only a miss reads the whole context.
"""
from __future__ import annotations

import functools

import torch

from . import aot, shipped
from .dispatch import DeviceInfo, register_library_op, use_triton

try:  # Triton is optional: a CPU-only install runs the reference
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

BLOCK = 2048
NUM_WARPS = 8
PAD = -1


if triton is not None:
    PAD_TOKEN = tl.constexpr(PAD)  # a global read inside a kernel must be a constexpr

    @triton.jit
    def _ngram_match_kernel(
        ctx_ptr, stride_row, n_ptr, cont_ptr, clen_ptr, k,
        NGRAM: tl.constexpr,
        BLOCK: tl.constexpr,
        K_P2: tl.constexpr,
    ):
        row = tl.program_id(0)
        n = tl.load(n_ptr + row)
        base = ctx_ptr + row.to(tl.int64) * stride_row
        offs = tl.arange(0, BLOCK)

        found = tl.full((), -1, tl.int32)
        hi = n - NGRAM - 1  # the latest start that is not the trailing n-gram itself
        while (hi >= 0) & (found < 0):
            lo = hi - BLOCK + 1
            p = lo + offs
            ok = p >= 0
            hit = ok
            for t in tl.static_range(NGRAM):
                want = tl.load(base + n - NGRAM + t)
                got = tl.load(base + p + t, mask=ok, other=PAD_TOKEN)
                hit = hit & (got == want)
            found = tl.max(tl.where(hit, p, -1), 0)
            hi = lo - 1

        j = tl.arange(0, K_P2)
        src = found + NGRAM + j
        end = tl.where(found >= 0, n, 0)  # no match: nothing to take
        take = (j < k) & (src < end)
        tok = tl.load(base + src, mask=take, other=PAD_TOKEN)
        tl.store(cont_ptr + row * k + j, tok, mask=j < k)
        length = tl.where(found >= 0, tl.minimum(k, n - found - NGRAM), 0)
        tl.store(clen_ptr + row, length)


# --- reference -----------------------------------------------------------------------------

def _check(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int) -> None:
    if ctx.dim() != 2 or n_tokens.dim() != 1 or n_tokens.shape[0] > ctx.shape[0]:
        raise ValueError(f"ctx must be [R, L] and n_tokens [B<=R], got {tuple(ctx.shape)} "
                         f"and {tuple(n_tokens.shape)}")
    if ctx.dtype != torch.int32 or n_tokens.dtype != torch.int32:
        raise ValueError("ctx and n_tokens must be int32")
    if k < 1 or ngram < 1:
        raise ValueError(f"k and ngram must be >= 1, got k={k} ngram={ngram}")


def ngram_match_reference(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cont int32 [B, k], clen int32 [B]) for rows ``0..B-1`` of ``ctx`` (B = len(n_tokens))."""
    _check(ctx, n_tokens, k, ngram)
    rows = n_tokens.shape[0]
    cont = torch.full((rows, k), PAD, dtype=torch.int32, device=ctx.device)
    clen = torch.zeros(rows, dtype=torch.int32, device=ctx.device)
    for b, n in enumerate(n_tokens.tolist()):
        if n <= ngram:
            continue
        seq = ctx[b, :n]
        windows = seq[: n - 1].unfold(0, ngram, 1)  # starts 0 .. n-ngram-1
        hits = (windows == seq[n - ngram:]).all(dim=1).nonzero()
        if hits.numel() == 0:
            continue
        p = int(hits[-1])
        tail = seq[p + ngram: p + ngram + k]
        cont[b, : tail.numel()] = tail
        clen[b] = tail.numel()
    return cont, clen


# --- Triton launcher -----------------------------------------------------------------------

def _launch(ctx, n_tokens, k, ngram, block, num_warps):
    if triton is None:
        raise RuntimeError("the ngram_match Triton kernel needs triton")
    _check(ctx, n_tokens, k, ngram)
    if ctx.stride(-1) != 1:
        ctx = ctx.contiguous()
    rows = n_tokens.shape[0]
    cont = torch.empty((rows, k), dtype=torch.int32, device=ctx.device)
    clen = torch.empty(rows, dtype=torch.int32, device=ctx.device)
    if rows:
        _ngram_match_kernel[(rows,)](
            ctx, ctx.stride(0), n_tokens, cont, clen, k,
            NGRAM=ngram, BLOCK=block, K_P2=triton.next_power_of_2(k), num_warps=num_warps,
        )
    return cont, clen


def ngram_match_triton(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel; same contract as ``ngram_match_reference``."""
    return _launch(ctx, n_tokens, k, ngram, BLOCK, NUM_WARPS)


# --- the op --------------------------------------------------------------------------------

def _ngram_match_gpu(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(ctx, n_tokens):
        return ngram_match_triton(ctx, n_tokens, k, ngram)
    return ngram_match_reference(ctx, n_tokens, k, ngram)


def _ngram_match_cpu(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    return ngram_match_reference(ctx, n_tokens, k, ngram)


def _ngram_match_fake(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int):
    rows = n_tokens.shape[0]
    return (ctx.new_empty((rows, k), dtype=torch.int32),
            ctx.new_empty(rows, dtype=torch.int32))


_OP = register_library_op("ngram_match", _ngram_match_cpu, _ngram_match_gpu, _ngram_match_fake)


def ngram_match(ctx: torch.Tensor, n_tokens: torch.Tensor, k: int, ngram: int = 3
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Continuation (up to ``k``) after the latest earlier occurrence of each row's trailing
    ``ngram``-gram; Triton on GPU, reference on CPU."""
    return _OP(ctx, n_tokens, k, ngram)


# --- ahead-of-time launches (radiance.kernels.aot): the MTP profiles' draft depth, the context
# mirror's row widths ---------------------------------------------------------------------------

def _aot_launches(dev: DeviceInfo, arch: str):
    for width in shipped.NGRAM_WIDTHS:
        yield (f"k={shipped.NGRAM_K} n={shipped.NGRAM} width={width}",
               functools.partial(_aot_call, width, shipped.NGRAM_K, shipped.NGRAM))


def _aot_call(width: int, k: int, ngram: int) -> None:
    ngram_match_triton(torch.empty((8, width), dtype=torch.int32), torch.empty(8, dtype=torch.int32), k, ngram)


if triton is not None:
    aot.register("ngram_match", "dynamic_draft", _aot_launches)
