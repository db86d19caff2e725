"""How often the target accepts each draft position, from the steps that finished.

vLLM's scheduler learns, for every request of a finished step, how many draft tokens it had proposed
and how many the target kept (``Scheduler.update_from_output``). A draft of ``n`` tokens with ``a``
accepted reached positions 1..n and was accepted at positions 1..a.

What is counted is the acceptance of each position *given that the one before it was accepted* (the
conditional rate c_i: of the drafts that reached position i with i - 1 accepted, the share accepted at i).
``rate(i)`` is the unconditional rate vLLM's ``spec_decode_num_accepted_tokens_per_pos`` reports,
``c_1 x ... x c_i``, so ``1 + r_1 + ... + r_d`` is still the expected number of tokens a request gains from
a step drafting d. Why conditional: an unconditional count at a deep position is stale wherever that
position is not drafted, and stayed so. On the H100 (docs/benchmarks.md, twenty-first session) a phase
with nothing accepted left positions 2-4 at 0; the next, code-like phase (true 0.82 / 0.75 / 0.68) was
drafted at depth 1 only, so those zeros never moved and the policy ran 0.56x-0.70x stock. Conditionally,
a phase that accepts nothing at position 1 says nothing about c_2 (no draft reaches position 2 with 1
accepted), and when position 1 is accepted again r_2 rises with it. Each deeper position's rate is drawn
towards the one before it by ``PRIOR`` drafts' weight (the drafter is assumed to get no better deeper into
the draft): a position never drafted reads as the one before, so a depth never drafted is still worth
something to the policy, and one with thin evidence is not read from a few drafts alone.

The estimate forgets at the pace drafts come in: a step with ``n`` requests drafting scales every position's
past counts by ``DECAY ** n`` (half-life ~70 drafts, at any batch size). Decaying by step instead let a batch
of 32 outweigh 32 steps of a single request (docs/benchmarks.md, seventeenth session). One clock for every
position, not one per position's own evidence: a deep position's evidence comes only with the position
before it accepted, so on its own clock a code-like past outlived a prose-like phase (a replay of the
fifteenth session's costs, benchmarks/bench_depth_policy_replay.py, put the common clock ahead;
docs/benchmarks.md, twenty-first session). A position no draft reaches keeps its counts' ratio
while they fade, so it reads more and more as the position before: ~110 drafts without it take a full
memory (~100) under the 32 drafts tau asks for.
Pure host arithmetic, no torch, no vLLM.
"""
from __future__ import annotations

from typing import Sequence

DECAY = 0.99  # per request drafting in a step: half-life ~70 drafts
PRIOR = 1.0   # drafts' weight of the position before's rate in a deeper position's


class AcceptanceEstimate:
    def __init__(self, depth: int, decay: float = DECAY) -> None:
        self.depth = depth
        self.decay = decay
        self._tried = [0.0] * depth    # drafts that reached position i with i - 1 accepted (decayed)
        self._kept = [0.0] * depth     # of those, accepted at i
        self._read: list[float] | None = None   # the unconditional rates, until the next observe

    def observe(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """One finished step: per request, tokens drafted and tokens the target accepted."""
        tried, kept = [0] * self.depth, [0] * self.depth
        for n, a in zip(drafted, accepted):
            n = min(n, self.depth)
            a = min(a, n)
            for i in range(min(n, a + 1)):    # position i + 1 reached with every position before it accepted
                tried[i] += 1
            for i in range(a):
                kept[i] += 1
        self._read = None
        f = self.decay ** tried[0]   # one clock for every position: the drafts of this step
        for i in range(self.depth):
            self._tried[i] = self._tried[i] * f + tried[i]
            self._kept[i] = self._kept[i] * f + kept[i]

    def conditional(self, position: int) -> float | None:
        """Acceptance at 1-based ``position`` given ``position - 1`` accepted; None until a draft has reached
        position 1. Deeper positions are drawn towards the rate of the position before, as if ``PRIOR``
        drafts had been accepted at it like there: where a position has no evidence of its own it reads as
        the position before, and a few unlucky drafts on faded evidence cannot pin it near 0 (a replay of
        `radiance bench`'s rounds once read 0.9 as 0.002 from one draft on faded evidence, and ran depth 1
        through the next code-like phase)."""
        t, k = self._tried[0], self._kept[0]
        if t <= 0.0:
            return None
        c = k / t
        for i in range(1, position):
            c = (self._kept[i] + PRIOR * c) / (self._tried[i] + PRIOR)
        return c

    def rate(self, position: int) -> float | None:
        """Estimated unconditional acceptance at 1-based ``position``; None until a draft has reached
        position 1."""
        if self._read is None:
            if self._tried[0] <= 0.0:
                return None
            # every position in one pass: the policy reads them several times a step, on the host
            read, r, c = [], 1.0, self._kept[0] / self._tried[0]
            for i in range(self.depth):
                if i:
                    c = (self._kept[i] + PRIOR * c) / (self._tried[i] + PRIOR)
                r *= c
                read.append(r)
            self._read = read
        return self._read[position - 1]

    def evidence(self, position: int) -> float:
        """Drafts (decayed) that reached 1-based ``position`` with the one before accepted."""
        return self._tried[position - 1]

    def rates(self) -> list[float | None]:
        return [self.rate(i) for i in range(1, self.depth + 1)]

    def expected_tokens(self, depth: int) -> float | None:
        """Tokens a request gains from a step drafting ``depth``: the target's own plus the accepted
        drafts. None until a draft has reached position 1."""
        total = 1.0
        for i in range(1, depth + 1):
            r = self.rate(i)
            if r is None:
                return None
            total += r
        return total
