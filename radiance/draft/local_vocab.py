"""Draft sampling from vocabulary shards at TP>1: the token and its confidence without the row.

The controller needs, per request and draft slot, the drafted token and its top-1 softmax
probability. Computing logits the stock way all-gathers every rank's [B, V/tp] shard into the
full [B, V] row on every draft slot. Both numbers follow from three per-row reductions that
combine exactly across shards, so each rank reduces its own shard to

    m_r = max,   s_r = sum exp(x - m_r),   a_r = argmax (as a global token id)

and the ranks exchange those three floats per row. With M = max_r m_r, the full row's
sum-exp is S = sum_r s_r * exp(m_r - M), the token is the a_r of a rank reaching M (the lowest
id on a tie, as ``torch.argmax`` on the full row), and its probability is 1 / S. Same values,
same arithmetic up to fp32 associativity: not an approximation.

Padding columns (vLLM pads the vocabulary to a multiple of 64 per shard, at the end of the last
shard) are excluded by ``n_valid``, so a padding entry can never win nor add to the sum. A shard
made only of padding reports m = -inf, s = 0, and loses to any real entry.

Token ids travel as fp32, exact below 2**24; ``check_vocab`` refuses larger vocabularies.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..kernels.draft_confidence import draft_confidence

EXACT_ID_LIMIT = 2 ** 24


def check_vocab(vocab_size: int) -> None:
    if vocab_size > EXACT_ID_LIMIT:
        raise ValueError(f"vocabulary of {vocab_size} ids: ids >= 2**24 are not exact in fp32")


def shard_stats(local_logits: torch.Tensor, vocab_start: int, n_valid: int) -> torch.Tensor:
    """[B, 3] fp32 (max, sum-exp, global argmax id) of this rank's ``local_logits[:, :n_valid]``."""
    big_m, total, idx = draft_confidence(local_logits, n_valid)
    return torch.stack([big_m, total, (idx + vocab_start).to(torch.float32)], dim=-1)


def combine(stats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, R, 3] per-rank stats -> (token int64 [B], confidence fp32 [B])."""
    m, s, ids = stats[..., 0], stats[..., 1], stats[..., 2]
    big_m = m.max(dim=1, keepdim=True).values
    base = torch.where(big_m == float("-inf"), torch.zeros_like(big_m), big_m)
    total = (s * torch.exp(m - base)).sum(dim=1)
    winner = torch.where(m == big_m, ids, torch.full_like(ids, float("inf")))
    token = winner.min(dim=1).values.to(torch.int64)
    return token, 1.0 / total


def sample_top1(local_logits: torch.Tensor, vocab_start: int, n_valid: int,
                gather: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy draft token and its probability. ``gather`` maps this rank's [B, 3] stats to the
    group's [B, R, 3] (rank order); None for a single rank."""
    if gather is None:
        _, total, idx = draft_confidence(local_logits, n_valid)
        return idx + vocab_start if vocab_start else idx, 1.0 / total
    return combine(gather(shard_stats(local_logits, vocab_start, n_valid)))
