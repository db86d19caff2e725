"""int4-head's speed rule: each head call takes the 4-bit path only at row counts where it is not slower.

The head's cost per step is not one decode GEMV. vLLM verifies a speculative step by sending every
request's draft tokens and bonus position through the head (B x (k + 1) rows), and the MTP drafter,
which aliases the target's head, calls it once per draft slot (B rows each). The 4-bit kernel streams a
quarter of the bytes but re-reads its weight per 64-row tile and pays a launch of its own: it wins at a
few rows and loses at a large verification batch (the 27B head on the H200: 2.9x at 8 rows, 0.4x at 160),
and on a tiny vocabulary it loses everywhere. So at load, with the bf16 weight and its 4-bit codes both
in hand, both heads are timed on this GPU at every row count the deployment's steps produce (B = 1, 2,
4, ... up to max_num_seqs, rows capped by max_num_batched_tokens), as vLLM calls them: eagerly, outside
the compiled graph (logits are computed there), one call after another with the host's launch included.

The plan that follows (``plan``): the 4-bit path serves calls of up to the largest row count below
which it never lost; above it the call goes to the bf16 weight, which then stays loaded (a quarter more
memory than the bf16 head alone). Where 4 bits win at every row count the bf16 weight is freed; where
they lose already at the smallest, the feature declines with the numbers in its reason. A step is
therefore never slower than stock's by the rule's own timings, whichever calls the drafter makes.

Prompt logprobs are not decode: vLLM computes them in one head call over every prompt token (the gate's
target check scores ~500 tokens so), above the plan's row count. Those calls, and only those (the runner's
prompt-logprob computation, ``radiance.runner_prompt_logprobs.SCORING``), take the 4-bit head in calls of at
most ``w4_max_rows`` rows (``Int4HeadMethod``): the check then scores the head decode serves, and decode's
own calls keep the plan.

On a CPU the rule is not applied: the reference path serves the tests' numerics, not speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

MARGIN = 1.0        # a 4-bit call must cost <= MARGIN x the bf16 call at its row count
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


def time_rows(bf16_head, w4_head, hidden: int, dtype: torch.dtype, device: torch.device,
              rows: list[int]) -> dict[int, tuple[float, float]]:
    """{rows: (4-bit µs, bf16 µs)} per head call."""
    gen = torch.Generator(device=device).manual_seed(0)
    cost: dict[int, tuple[float, float]] = {}
    for m in sorted(set(rows)):
        x = torch.randn((m, hidden), generator=gen, device=device).to(dtype)
        cost[m] = (eager_us(w4_head, x), eager_us(bf16_head, x))
    return cost


def step_rows(shapes: Shapes) -> list[int]:
    """Every row count a head call of this deployment's decode steps has."""
    return sorted({m for b in shapes.batches() for m in shapes.calls(b)})


@dataclass(frozen=True)
class Plan:
    w4_max_rows: int           # head calls of at most this many rows take the 4-bit path; 0: none
    reason: str | None = None  # why the feature declines (w4_max_rows == 0)
    lost_at: tuple[int, float, float] | None = None  # (rows, 4-bit µs, bf16 µs): the first row count 4 bits lose

    @property
    def keeps_bf16(self) -> bool:
        """Some row count goes to the bf16 weight, which then stays loaded."""
        return self.w4_max_rows > 0 and self.lost_at is not None


def plan(cost: dict[int, tuple[float, float]]) -> Plan:
    """The 4-bit path up to the largest row count below which it never lost (``MARGIN``), bf16 above."""
    rows = sorted(cost)
    lost = next((m for m in rows if cost[m][0] > MARGIN * cost[m][1]), None)
    if lost is None:
        return Plan(w4_max_rows=rows[-1] if rows else 0)
    w4, bf = cost[lost]
    if lost == rows[0]:
        return Plan(0, reason=(f"the 4-bit head is slower than the bf16 head on this GPU already at {lost} "
                                      f"rows ({w4:.0f} vs {bf:.0f} µs per call), the smallest head call this "
                                      "deployment makes"), lost_at=(lost, w4, bf))
    below = max(m for m in rows if m < lost)
    return Plan(w4_max_rows=below, lost_at=(lost, w4, bf))


def step_costs(cost: dict[int, tuple[float, float]], shapes: Shapes, w4_max_rows: int
               ) -> list[tuple[int, float, float]]:
    """[(B, µs per step with the plan's paths, µs per step with the bf16 head)] for each B."""
    out = []
    for b in shapes.batches():
        calls = shapes.calls(b)
        out.append((b, sum(cost[m][0] if m <= w4_max_rows else cost[m][1] for m in calls),
                    sum(cost[m][1] for m in calls)))
    return out


def summary(rows: list[tuple[int, float, float]]) -> str:
    return ", ".join(f"B={b} {w4:.0f}/{bf:.0f} µs" for b, w4, bf in rows)
