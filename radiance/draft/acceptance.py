"""How often the target accepts each draft position, from the steps that finished.

vLLM's scheduler learns, for every request of a finished step, how many draft tokens it had proposed
and how many the target kept (``Scheduler.update_from_output``). A draft of ``n`` tokens with ``a``
accepted reached positions 1..n and was accepted at positions 1..a. The estimate at position i is
the share of drafts reaching i that were accepted there: the unconditional per-position rate vLLM's
``spec_decode_num_accepted_tokens_per_pos`` reports, so ``1 + r_1 + ... + r_d`` is the expected
number of tokens a request gains from a step drafting d.

Counts decay by ``DECAY`` per step, so the estimate follows the traffic (code, then prose) over a few
hundred steps. A position not drafted for a while keeps its last estimate: both of its counts decay
alike, their ratio stays. Pure host arithmetic, no torch, no vLLM.
"""
from __future__ import annotations

from typing import Sequence

DECAY = 0.99  # per step: half-life ~70 steps


class AcceptanceEstimate:
    def __init__(self, depth: int, decay: float = DECAY) -> None:
        self.depth = depth
        self.decay = decay
        self._reached = [0.0] * depth
        self._accepted = [0.0] * depth

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """One finished step: per request, tokens drafted and tokens the target accepted."""
        d = self.decay
        reached = [x * d for x in self._reached]
        acc = [x * d for x in self._accepted]
        for n, a in zip(drafted, accepted):
            n = min(n, self.depth)
            for i in range(n):
                reached[i] += 1.0
            for i in range(min(a, n)):
                acc[i] += 1.0
        self._reached, self._accepted = reached, acc

    def rate(self, position: int) -> float | None:
        """Estimated acceptance at 1-based ``position``; None until a draft has reached it."""
        r = self._reached[position - 1]
        return self._accepted[position - 1] / r if r > 1e-9 else None

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
