"""int4-head's speed rule: the 4-bit head is used only where it is not slower than the bf16 head.

The head's cost per step is not one decode GEMV. vLLM verifies a speculative step by sending every
request's draft tokens and bonus position through the head (B x (k + 1) rows), and the MTP drafter,
which shares the target's head, calls it once per draft slot (B rows each). The 4-bit kernel streams a
quarter of the bytes but re-reads its weight per 64-row tile and pays a launch of its own; at a small
vocabulary (the tiny test models) or a large verification batch it can lose. So at load, with the bf16
weight and its 4-bit codes both in hand, both heads are timed on this GPU at every step shape the
deployment can produce (B = 1, 2, 4, ... up to max_num_seqs, rows capped by max_num_batched_tokens), as
vLLM calls them: eagerly, outside the compiled graph (logits are computed there), one call after another
with the host's launch cost included. If the 4-bit head is slower per step at any B, the feature
declines with the numbers in its reason and the head stays as loaded.

On a CPU the rule is not applied: the reference path serves the tests' numerics, not speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

MARGIN = 1.0        # the 4-bit step must cost <= MARGIN x the bf16 step at every B
WARMUP, ITERS = 3, 15


@dataclass(frozen=True)
class Shapes:
    max_seqs: int
    k: int               # draft tokens per step (0: no speculative decoding)
    drafter_shares_head: bool
    max_rows: int        # max_num_batched_tokens

    def batches(self) -> list[int]:
        out, b = [], 1
        while b < self.max_seqs:
            out.append(b)
            b *= 2
        return out + [self.max_seqs]

    def calls(self, b: int) -> list[int]:
        """Rows of each head call in one decode step at B = b."""
        rows = [min(b * (self.k + 1), self.max_rows)]
        if self.k and self.drafter_shares_head:
            rows += [b] * self.k
        return rows


def shapes_from_config(cfg) -> Shapes:
    sched = getattr(cfg, "scheduler_config", None)
    spec = getattr(cfg, "speculative_config", None)
    k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    method = str(getattr(spec, "method", "") or "") if spec is not None else ""
    max_seqs = int(getattr(sched, "max_num_seqs", 0) or 256)
    max_rows = int(getattr(sched, "max_num_batched_tokens", 0) or max_seqs * (k + 1))
    return Shapes(max_seqs=max_seqs, k=k, drafter_shares_head=method.endswith("mtp"),
                  max_rows=max_rows)


def eager_us(fn, x: torch.Tensor) -> float:
    for _ in range(WARMUP):
        fn(x)
    torch.cuda.synchronize(x.device)
    t = time.perf_counter()
    for _ in range(ITERS):
        fn(x)
    torch.cuda.synchronize(x.device)
    return (time.perf_counter() - t) * 1e6 / ITERS


def compare(bf16_head, w4_head, hidden: int, dtype: torch.dtype, device: torch.device,
            shapes: Shapes) -> list[tuple[int, float, float]]:
    """[(B, 4-bit step µs, bf16 step µs)] for each B the deployment can run."""
    gen = torch.Generator(device=device).manual_seed(0)
    rows = sorted({m for b in shapes.batches() for m in shapes.calls(b)})
    cost: dict[int, tuple[float, float]] = {}
    for m in rows:
        x = torch.randn((m, hidden), generator=gen, device=device).to(dtype)
        cost[m] = (eager_us(w4_head, x), eager_us(bf16_head, x))
    out = []
    for b in shapes.batches():
        calls = shapes.calls(b)
        out.append((b, sum(cost[m][0] for m in calls), sum(cost[m][1] for m in calls)))
    return out


def verdict(rows: list[tuple[int, float, float]], shapes: Shapes) -> str | None:
    """None: the 4-bit head is not slower at any B; else the reason to decline."""
    slower = [(b, w4, bf) for b, w4, bf in rows if w4 > MARGIN * bf]
    if not slower:
        return None
    b, w4, bf = slower[0]
    return (f"the 4-bit head is slower than the bf16 head on this GPU at B={b} ({w4:.0f} vs {bf:.0f} µs per "
            f"step: head calls of {shapes.calls(b)} rows), and at {len(slower)} of {len(rows)} batch sizes "
            f"up to max_num_seqs={shapes.max_seqs}")


def summary(rows: list[tuple[int, float, float]]) -> str:
    return ", ".join(f"B={b} {w4:.0f}/{bf:.0f} µs" for b, w4, bf in rows)
