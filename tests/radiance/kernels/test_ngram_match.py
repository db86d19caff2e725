"""ngram_match: Triton equals the reference exactly (continuations and lengths are integers)."""
from __future__ import annotations

import textwrap

import pytest
import torch

from radiance.kernels.ngram_match import (ngram_match, ngram_match_reference,
                                          ngram_match_triton)


def make_ctx(rows, length, vocab, seed, device="cpu"):
    """Token rows from a small vocabulary (repeats are common) with lengths from 0 to full."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randint(0, vocab, (rows, length), generator=g, dtype=torch.int32)
    n = torch.randint(0, length + 1, (rows,), generator=g, dtype=torch.int32)
    n[0] = length
    return ctx.to(device), n.to(device)


# (dtype, atol, rtol): integer outputs, compared exactly
EXACT = [(torch.int32, 0, 0)]
# (rows, context, vocab, k, ngram)
SHAPES = [(1, 16, 3, 4, 2), (5, 300, 4, 8, 3), (7, 3000, 50, 8, 3), (64, 8192, 2000, 8, 3),
          (64, 8192, 4, 8, 4), (3, 5000, 100000, 5, 1), (16, 257, 2, 3, 2)]


def test_reference_semantics():
    ctx = torch.tensor([[5, 1, 2, 3, 9, 8, 1, 2, 3, 7, 1, 2, 3, 0],
                        [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 0, 0],
                        [4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0],
                        [1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    n = torch.tensor([13, 12, 7, 2], dtype=torch.int32)
    cont, clen = ngram_match_reference(ctx, n, k=4, ngram=3)
    # row 0: trailing 1,2,3 last occurred at 6..8 (not 1..3): continuation 7,1,2,3
    assert cont[0].tolist() == [7, 1, 2, 3] and clen[0] == 4
    # row 1: the match at 0..2 is followed by 4,5,6,7
    assert cont[1].tolist() == [4, 5, 6, 7] and clen[1] == 4
    # row 2: 4,4,4 most recently at 3..5 -> one token (6) before the end of the context
    assert cont[2].tolist() == [4, -1, -1, -1] and clen[2] == 1
    # row 3: too short for a trailing 3-gram and an earlier one
    assert clen[3] == 0 and cont[3].tolist() == [-1] * 4


@pytest.mark.parametrize("dtype,atol,rtol", EXACT)
@pytest.mark.parametrize("rows,length,vocab,k,ngram", SHAPES[:3])
def test_op_on_cpu_is_the_reference(rows, length, vocab, k, ngram, dtype, atol, rtol):
    ctx, n = make_ctx(rows, length, vocab, rows + length)
    got = ngram_match(ctx, n, k, ngram)
    want = ngram_match_reference(ctx, n, k, ngram)
    for a, b in zip(got, want):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


def test_opcheck_cpu():
    ctx, n = make_ctx(4, 100, 3, 0)
    torch.library.opcheck(torch.ops.radiance.ngram_match, (ctx, n, 8, 3))


_INTERPRETER_CHECK = textwrap.dedent("""
    import torch
    from radiance.kernels.ngram_match import ngram_match_triton, ngram_match_reference
    g = torch.Generator().manual_seed(0)
    for rows, length, vocab, k, ngram in [(6, 3000, 5, 8, 3), (4, 5000, 100000, 5, 2),
                                          (5, 40, 2, 3, 1), (3, 2100, 3, 8, 4)]:
        ctx = torch.randint(0, vocab, (rows, length), generator=g, dtype=torch.int32)
        n = torch.randint(0, length + 1, (rows,), generator=g, dtype=torch.int32)
        n[0] = length
        got = ngram_match_triton(ctx, n, k, ngram)
        want = ngram_match_reference(ctx, n, k, ngram)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (got, want)
    print("ok")
""")


def test_triton_kernel_in_the_interpreter(run_interpreted):
    out = run_interpreted(_INTERPRETER_CHECK)
    assert "ok" in out, out[-3000:]


def test_aot_compiles(aot_arch, aot_specs, aot_compile):
    mine = aot_specs("ngram_match", aot_arch)
    assert mine
    for spec in mine:
        aot_compile(spec, aot_arch)




@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", EXACT)
@pytest.mark.parametrize("rows,length,vocab,k,ngram", SHAPES)
def test_triton_equals_reference_on_gpu(rows, length, vocab, k, ngram, dtype, atol, rtol):
    ctx, n = make_ctx(rows, length, vocab, rows * 7 + length, "cuda")
    want = ngram_match_reference(ctx, n, k, ngram)
    for got in (ngram_match_triton(ctx, n, k, ngram), ngram_match(ctx, n, k, ngram)):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=atol, rtol=rtol)


@pytest.mark.gpu
def test_wider_mirror_than_batch_on_gpu():
    # the mirror has more rows (max_num_seqs) than the step's batch and a longer row stride
    ctx, n = make_ctx(32, 4000, 6, 5, "cuda")
    got = ngram_match_triton(ctx, n[:9], 8, 3)
    want = ngram_match_reference(ctx, n[:9], 8, 3)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.gpu
def test_opcheck_gpu():
    ctx, n = make_ctx(8, 2000, 4, 2, "cuda")
    torch.library.opcheck(torch.ops.radiance.ngram_match, (ctx, n, 8, 3))
