"""How often the target accepts each draft position, from the steps that finished.

vLLM's scheduler learns, for every request of a finished step, how many draft tokens it had proposed
and how many the target kept (``Scheduler.update_from_output``). A draft of ``n`` tokens with ``a``
accepted reached positions 1..n and was accepted at positions 1..a. The estimate at position i is
the share of drafts reaching i that were accepted there: the unconditional per-position rate vLLM's
``spec_decode_num_accepted_tokens_per_pos`` reports, so ``1 + r_1 + ... + r_d`` is the expected
number of tokens a request gains from a step drafting d.

The estimate forgets at the pace new evidence comes in: a step whose drafts reach position i ``n`` times
scales that position's past counts by ``DECAY ** n`` (half-life ~70 drafts, at any batch size). Decaying by
step instead let a batch of 32 outweigh 32 steps of a single request: after a code-like B = 32 phase, a
prose-like B = 1 phase of ~140 steps still read 0.42 / 0.32 at positions 3 / 4 (true: 0.12 / 0.06). A replay of
`radiance bench`'s order on the fifteenth session's H100 step costs (benchmarks/bench_depth_policy_replay.py,
a model, not a measurement; docs/benchmarks.md, seventeenth session) put forgetting by draft ahead of both
forgetting by step and weighting each step once (where a nearly empty step at the end of a run counted as
much as a full one). A position no draft reaches keeps its estimate and its evidence until drafts reach it
again: what tau ruled out stays out until a re-probe sees it accepted.
Pure host arithmetic, no torch, no vLLM.
"""
from __future__ import annotations

from typing import Sequence

DECAY = 0.99  # per draft reaching the position: half-life ~70 drafts


class AcceptanceEstimate:
    def __init__(self, depth: int, decay: float = DECAY) -> None:
        self.depth = depth
        self.decay = decay
        self._reached = [0.0] * depth
        self._accepted = [0.0] * depth

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """One finished step: per request, tokens drafted and tokens the target accepted."""
        reached, acc = [0] * self.depth, [0] * self.depth
        for n, a in zip(drafted, accepted):
            n = min(n, self.depth)
            for i in range(n):
                reached[i] += 1
            for i in range(min(a, n)):
                acc[i] += 1
        for i in range(self.depth):
            f = self.decay ** reached[i]
            self._reached[i] = self._reached[i] * f + reached[i]
            self._accepted[i] = self._accepted[i] * f + acc[i]

    def rate(self, position: int) -> float | None:
        """Estimated acceptance at 1-based ``position``; None until a draft has reached it."""
        r = self._reached[position - 1]
        return self._accepted[position - 1] / r if r > 0.0 else None   # once reached, never below 1

    def evidence(self, position: int) -> float:
        """Drafts (decayed) that reached 1-based ``position``."""
        return self._reached[position - 1]

    def rates(self) -> list[float | None]:
        return [self.rate(i) for i in range(1, self.depth + 1)]

    def expected_tokens(self, depth: int) -> float | None:
        """Tokens a request gains from a step drafting ``depth``: the target's own plus the accepted
        drafts. None while a position up to ``depth`` has no estimate."""
        total = 1.0
        for i in range(1, depth + 1):
            r = self.rate(i)
            if r is None:
                return None
            total += r
        return total
