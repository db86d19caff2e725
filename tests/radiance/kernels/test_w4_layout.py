"""The packed 4-bit layout: bit positions, round trips, chunking, group-size rules."""
import pytest
import torch

from radiance.kernels import w4_layout as layout


def test_nibble_i_of_word_j_is_k_16i_plus_j():
    k = 256
    q = torch.zeros((2, k), dtype=torch.int8)
    q[1, 128 + 16 * 5 + 3] = 7      # block 1, nibble 5, word 3
    q[0, 16 * 7 + 15] = -8          # block 0, nibble 7 (sign bit of the word), word 15
    qw = layout.pack_codes(q)
    assert qw.shape == (1, 2, 16, 16) and qw.dtype == torch.int32   # [tile, block, row, word]
    def signed(u32):
        return u32 - 2**32 if u32 >= 2**31 else u32

    # code 0 is nibble 8 everywhere; 7 -> 0xF in nibble 5; -8 -> 0x0 in nibble 7
    assert int(qw[0, 1, 1, 3]) == signed(0x88F88888)
    assert int(qw[0, 0, 0, 15]) == signed(0x08888888)
    assert int(qw[0, 0, 1, 0]) == signed(0x88888888)
    assert int(qw[0, 1, 15, 0]) == signed(0x88888888)   # row padding: code 0


def test_a_tile_block_is_one_contiguous_kib():
    q = torch.randint(-8, 8, (40, 384), dtype=torch.int8)
    qw = layout.pack_codes(q)
    assert qw.is_contiguous() and tuple(qw.shape) == (3, 3, 16, 16)
    # rows 16..31, K block 2 are words [(1 * 3 + 2) * 256, +256) of the flat buffer
    flat = qw.flatten()[(1 * 3 + 2) * 256:(1 * 3 + 3) * 256].view(16, 16)
    assert torch.equal(flat, layout.pack_codes(q[16:32, 256:384])[0, 0])


@pytest.mark.parametrize("n,k,g", [(1, 128, 128), (7, 384, 128), (5, 320, 64), (3, 96, 32),
                                   (4, 512, 256), (9, 16, 16)])
def test_pack_unpack_round_trip(n, k, g):
    gen = torch.Generator().manual_seed(n * k)
    q = torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=gen)
    s = torch.rand((n, k // g), generator=gen).to(torch.bfloat16)
    qw, sc = layout.pack(q, s, g)
    assert (tuple(qw.shape), tuple(sc.shape)) == layout.packed_shapes(n, k, g)
    q2, s2 = layout.unpack(qw, sc, k, g)
    assert torch.equal(q, q2) and torch.equal(s, s2)
    assert layout.infer_group_size(qw, sc) == g


def test_padding_is_code_zero_and_scale_zero():
    q = torch.full((2, 64), 3, dtype=torch.int8)
    qw, sc = layout.pack(q, torch.ones((2, 1), dtype=torch.bfloat16), 64)
    full = layout.unpack_codes(qw, 128)
    assert full.shape == (16, 128)
    assert torch.equal(full[:2, 64:], torch.zeros((2, 64), dtype=torch.int8))
    assert torch.equal(full[2:], torch.zeros((14, 128), dtype=torch.int8))
    assert torch.equal(sc[1], torch.zeros(2, dtype=torch.bfloat16))


def test_row_chunks_pack_to_the_same_tiles():
    q = torch.randint(-8, 8, (40, 256), dtype=torch.int8)
    whole = layout.pack_codes(q)
    assert torch.equal(torch.cat([layout.pack_codes(q[:16]), layout.pack_codes(q[16:])]), whole)


def test_dequantize_is_codes_times_scales():
    q = torch.randint(-8, 8, (6, 256), dtype=torch.int8)
    s = (torch.rand(6, 2) + 0.1).to(torch.float16)
    qw, sc = layout.pack(q, s, 128)
    want = q.float() * s.float().repeat_interleave(128, dim=1)
    assert torch.equal(layout.dequantize(qw, sc, 256, 128, rows=4), want)


@pytest.mark.parametrize("k,g", [(256, 0), (256, 24), (256, 48), (384, 256), (200, 64)])
def test_bad_group_sizes_raise(k, g):
    with pytest.raises(ValueError):
        layout.check_group_size(k, g)
