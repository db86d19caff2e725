"""Local-vocabulary draft sampling equals sampling from the gathered full row."""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radiance.draft.local_vocab import check_vocab, combine, sample_top1, shard_stats


def make_shards(full: torch.Tensor, tp: int, pad_to: int = 64, pad_value: float = 1e4):
    """Split [B, V] like vLLM's vocab-parallel lm_head: V padded to a multiple of pad_to * tp,
    equal shards, padding at the end. Padding holds a huge logit that must never win."""
    b, v = full.shape
    padded = -(-v // (pad_to * tp)) * pad_to * tp
    per = padded // tp
    row = torch.full((b, padded), pad_value, dtype=full.dtype)
    row[:, :v] = full
    shards = []
    for r in range(tp):
        start = r * per
        n_valid = max(0, min(per, v - start))
        shards.append((row[:, start:start + per].contiguous(), start, n_valid))
    return shards


def reference(full: torch.Tensor):
    """Token and top-1 probability, the probability in fp64 (a sum over ~1e5 fp32 terms in
    another order differs by ~1e-5 relative: RTOL is that fp32 rounding, not a looser bar)."""
    x = full.double()
    return x.argmax(dim=-1), torch.softmax(x, dim=-1).max(dim=-1).values.float()


RTOL = 3e-5


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("vocab", [1000, 151936, 4097])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simulated_shards_equal_full_row(tp, vocab, dtype):
    g = torch.Generator().manual_seed(tp * 7 + vocab)
    full = (torch.randn(5, vocab, generator=g) * 4).to(dtype)
    full[1, vocab - 1] = 60.0   # the winner in the last real column, next to the padding
    full[2, 3] = full[2, vocab // 2] = 50.0  # a tie across shards: the lower id wins
    full[3] = full[3] * 0.01    # a flat row: the confidence is small and must stay exact
    shards = make_shards(full, tp)
    stats = torch.stack([shard_stats(x, start, n) for x, start, n in shards], dim=1)
    token, conf = combine(stats)
    want_tok, want_conf = reference(full)
    assert torch.equal(token, want_tok)
    torch.testing.assert_close(conf, want_conf, rtol=RTOL, atol=0)
    assert token[2] == 3


def test_a_shard_of_padding_only_never_wins():
    full = torch.randn(3, 100)
    # vLLM can leave a whole shard of padding when the vocabulary is small for the TP size
    shards = make_shards(full, tp=4, pad_to=64)
    assert shards[-1][2] == 0
    stats = torch.stack([shard_stats(x, s, n) for x, s, n in shards], dim=1)
    token, conf = combine(stats)
    assert torch.equal(token, full.argmax(-1))
    assert stats[:, -1, 0].eq(float("-inf")).all() and stats[:, -1, 1].eq(0).all()


def test_single_rank_fast_path():
    full = torch.randn(4, 3000)
    token, conf = sample_top1(full, 0, 3000)
    want_tok, want_conf = reference(full)
    assert torch.equal(token, want_tok)
    torch.testing.assert_close(conf, want_conf, rtol=RTOL, atol=0)


def test_ids_past_fp32_exactness_are_refused():
    check_vocab(248320)
    with pytest.raises(ValueError):
        check_vocab(2 ** 24 + 1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, full, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, start, n_valid = make_shards(full, world)[rank]

        def gather(stats):
            parts = [torch.empty_like(stats) for _ in range(world)]
            dist.all_gather(parts, stats)
            return torch.stack(parts, dim=1)

        token, conf = sample_top1(x, start, n_valid, gather)
        out[rank] = torch.cat([token.double(), conf.double()])
    finally:
        dist.destroy_process_group()


def test_gloo_two_ranks_equal_full_row():
    full = torch.randn(6, 151936) * 3
    full[0, 151935] = 40.0
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(2, _free_port(), full, out), nprocs=2, join=True)
    want_tok, want_conf = reference(full)
    for rank in range(2):
        token, conf = out[rank][:6].long(), out[rank][6:].float()
        assert torch.equal(token, want_tok)
        torch.testing.assert_close(conf, want_conf, rtol=RTOL, atol=0)
