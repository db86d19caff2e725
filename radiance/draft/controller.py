"""The per-slot decision of the dynamic-draft controller: pure host logic, no torch, no vLLM.

One decoding step drafts up to ``k`` tokens per request with serial MTP forwards (slot 0 is the
drafter's first pass, slot j its j-th extra forward). After the forward of slot j the controller
sees, for every request still drafting, the drafter's token ``mtp[j]`` and its top-1
probability ``conf[j]``, and decides for slot j:

* **n-gram** (a free win): the request's n-gram continuation has a token at j equal to the
  drafter's own guess. Draft ``mtp[:j] + cont[j:len]``: the verbatim tail costs no forward, so
  it fills the draft up to its full width even where the forward cap stops the MTP forwards.
* **continue**: the running product ``conf[0] * ... * conf[j-1]`` of the tokens kept so far is
  still >= tau. ``mtp[j]`` is kept and the request needs the next forward.
* **verify** (reason ``tau``): the product fell under tau. Draft ``mtp[:j]``.

The forward of slot j runs for a request whose product already fell under tau because it may
still agree with the n-gram at j; where the n-gram has no token at j that forward can only end
in *verify*, so the controller stops the request one slot early (same draft, one forward fewer).

The batch-size schedule caps the number of serial forwards at the step's concurrency: once
``cap`` forwards ran, the requests still drafting verify what they drafted (reason ``cap``).
Reaching ``k`` forwards ends the step (reason ``full``). Once no request is drafting, the rest
of the step's forwards are skipped: ``observe`` returns True and the hook breaks its loop.

Lossless by construction: only how many tokens are proposed, and whether a token comes from the
drafter or from earlier text, changes; the target verifies every proposal as before.

The step runs on the host between GPU forwards, so the per-row loops use plain lists: at the
batch sizes where drafting deep pays, that beats numpy's per-call overhead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .. import envs

CONTINUE, NGRAM, VERIFY = 0, 1, 2
REASONS = ("ngram", "tau", "cap", "full")
_NGRAM, _TAU, _CAP, _FULL = range(4)

# Tokens in the matched n-gram. Three is long enough that a match in code or JSON means a repeat
# of structure, short enough to recur within a few lines. A design constant, not a knob.
NGRAM_SIZE = 3


def forward_cap(schedule: Sequence[tuple[int, int]], batch_size: int) -> int | None:
    """Serial MTP forwards allowed at ``batch_size``: the depth of the largest schedule entry
    whose batch size is <= it (carry-forward); below the first entry, the first depth.
    None for an empty schedule (no cap)."""
    if not schedule:
        return None
    depth = schedule[0][1]
    for bs, d in schedule:
        if batch_size >= bs:
            depth = d
        else:
            break
    return max(1, depth)


@dataclass(frozen=True)
class DraftPolicy:
    tau: float = 0.28
    schedule: tuple[tuple[int, int], ...] = ((1, 8), (2, 7), (4, 6), (8, 5), (16, 4))
    ngram: int = NGRAM_SIZE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DraftPolicy":
        """The knobs as radiance/envs.py declares them; a bad value raises KnobError."""
        env = None if environ is None else dict(environ)
        return cls(tau=envs.get("RADIANCE_DRAFT_TAU", env),
                   schedule=envs.get("RADIANCE_DRAFT_SCHEDULE", env))

    def forward_cap(self, batch_size: int) -> int | None:
        return forward_cap(self.schedule, batch_size)


class StepController:
    """The controller's state for one decoding step of a batch.

    ``begin`` with the step's n-gram continuations; ``observe`` after each MTP forward (True once
    no request is drafting: skip the remaining forwards); ``drafts`` for the per-request drafts.
    One instance is reused step after step.
    """

    __slots__ = ("policy", "k", "limit", "cap_reason", "batch_size", "cont", "clen", "mtp",
                 "live", "cum", "stop_slot", "reason", "forwards", "draft_tokens",
                 "tail_tokens")

    def __init__(self, policy: DraftPolicy) -> None:
        self.policy = policy
        self.k = 0
        self.batch_size = 0
        self.forwards = 0
        self.live: list[int] = []

    def begin(self, k: int, cont: Sequence[Sequence[int]], clen: Sequence[int]) -> None:
        """Start a step drafting up to ``k`` tokens for ``len(clen)`` requests. ``cont[i]`` is
        request i's n-gram continuation, of which the first ``clen[i] <= k`` tokens are real."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        b = len(clen)
        self.k = k
        self.batch_size = b
        cap = self.policy.forward_cap(b)
        self.limit = k if cap is None else min(k, cap)
        self.cap_reason = _FULL if self.limit == k else _CAP
        self.cont = cont
        self.clen = clen
        self.mtp: list[Sequence[int]] = []
        self.live = list(range(b))
        self.cum = [1.0] * b
        self.stop_slot = [k] * b
        self.reason = [_FULL] * b
        self.forwards = 0
        self.draft_tokens = 0
        self.tail_tokens = 0

    def observe(self, j: int, tokens: Sequence[int], confs: Sequence[float]) -> bool:
        """Slot j's forward ran: ``tokens[i]``/``confs[i]`` for every request i of the batch.
        Returns True when no request drafts any more (the step's remaining forwards can go)."""
        if j != len(self.mtp):
            raise ValueError(f"slot {j} observed out of order (expected {len(self.mtp)})")
        self.mtp.append(tokens)
        self.forwards = nxt = j + 1
        tau = self.policy.tau
        cont, clen, cum = self.cont, self.clen, self.cum
        stop_slot, reason = self.stop_slot, self.reason
        last = nxt >= self.limit
        still = []
        # Inlined and branch-ordered for the common row that just keeps drafting: this loop runs
        # between two GPU forwards, once per slot.
        for i in self.live:
            if j < clen[i] and cont[i][j] == tokens[i]:
                stop_slot[i] = j
                reason[i] = _NGRAM
                continue
            c = cum[i]
            if c < tau:
                stop_slot[i] = j
                reason[i] = _TAU
                continue
            c *= confs[i]
            cum[i] = c
            # Lookahead: slot j+1 could only end in verify (no n-gram token there, product
            # under tau), so its forward is not worth running for this request.
            if c < tau and nxt >= clen[i] and not last:
                stop_slot[i] = nxt
                reason[i] = _TAU
                continue
            still.append(i)
        if still and last:
            r = self.cap_reason
            for i in still:
                stop_slot[i] = nxt
                reason[i] = r
            still = []
        self.live = still
        return not still

    @property
    def done(self) -> bool:
        return not self.live

    def drafts(self) -> list[list[int]]:
        """Each request's draft: its kept MTP tokens, then the n-gram tail where it took one.
        Also sets ``draft_tokens`` and ``tail_tokens`` (totals over the batch)."""
        if self.live:
            raise RuntimeError("drafts() before every request stopped")
        rows = list(zip(*self.mtp))  # per request, its token at every slot that ran
        stop_slot, reason, cont, clen = self.stop_slot, self.reason, self.cont, self.clen
        out = []
        total = tail = 0
        for i in range(self.batch_size):
            s = stop_slot[i]
            d = list(rows[i][:s])
            if reason[i] == _NGRAM:
                t = cont[i][s:clen[i]]
                d.extend(t)
                tail += len(t)
            total += len(d)
            out.append(d)
        self.draft_tokens = total
        self.tail_tokens = tail
        return out

    def ngram_tokens(self) -> list[int]:
        """Per request: how many tokens of its draft come from the n-gram tail (0 if none);
        they sit at the end of the draft, from ``stop_slot`` on."""
        return [self.clen[i] - self.stop_slot[i] if self.reason[i] == _NGRAM else 0
                for i in range(self.batch_size)]

    def reasons(self) -> list[str]:
        return [REASONS[r] for r in self.reason]

    def reason_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(REASONS, 0)
        for r in self.reason:
            counts[REASONS[r]] += 1
        return counts
