"""Lossless, as a GPU can check it: every greedy token a run emitted is the target's argmax for its prefix.

On a GPU the verification batch's shape changes with the drafts, so its numerics differ from stock's
and byte identity with stock decoding is not what lossless means there. What a correct speculative
decoder guarantees under greedy sampling is that each emitted token is the target's top-1 given the
tokens before it. The check re-scores prompt + output in a prefill (vLLM's prompt logprobs, top-1 and
the token's own; twice, in opposite batch orders, a lone prompt beside a companion sequence the second
time: launcher.bench.worker.rescore_passes) and looks at each output position:

* the emitted token is the prefill's argmax: agrees;
* it is not, but its logprob is within ``eps`` of the top-1 (the two were tied up to the difference
  between the prefill's and the decode's batch shapes): a tie, counted and reported with its margin;
* otherwise: a violation, which fails the check.

With two passes (or more), a position is judged only where they all judge it alike: it agrees where
every pass agrees, is a tie where every pass accepts it and one calls it a tie, and is a violation where
every pass calls it one. A position that one pass accepts and another calls a violation is *unstable*: the
re-scorings disagree with each other, so it is neither agreement nor a violation; it is counted and
reported, and it is not a scored position (seen on the H200: a lone re-scored request off in one pass at
every position, the other pass agreeing).

A prompt whose first output token is a violation in every pass is set aside as *unscorable*: that token
comes from the target's own prefill of the prompt, before any draft exists, so a re-scoring that
disagrees with it is disagreeing with the engine's prefill, not with speculative decoding (seen on the
H200 for a lone re-scored request: every position off by 3-9 nats, the first included). Such prompts are
counted and reported.

A batch is lossless only with at least one scored position and no violation; a batch with no scored
position (every prompt unscorable, every position unstable, nothing re-scored) is *inconclusive*, its
own verdict, never a pass. A set (``merge``) is lossless only if every batch it checked is: one
inconclusive batch makes the set inconclusive, and names the batch, unless another has violations.

Logprob differences are logit differences (log-softmax shifts every entry of a row alike), so ``eps``
is in logit units. The same check runs on stock, which calibrates it: stock never violates it either.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEFAULT_EPS = 0.25


@dataclass
class Position:
    index: int          # output position (0 = the first generated token)
    token: int
    top1: int
    margin: float       # top-1 logprob minus the emitted token's


@dataclass
class Verdict:
    prompts: int = 0
    positions: int = 0      # scored: every pass judged the position alike (agree, tie or violation)
    ties: int = 0
    violations: int = 0
    unstable: int = 0       # positions one pass accepts and another calls a violation: not scored
    unscorable: int = 0     # prompts whose re-scoring disagrees with the engine's prefill (position 0)
    max_tie_margin: float = 0.0
    first_violations: list[dict] = field(default_factory=list)   # up to 8, for the report
    eps: float = DEFAULT_EPS
    inconclusive_batches: list[int] = field(default_factory=list)  # merged: the batches with nothing scored

    @property
    def inconclusive(self) -> bool:
        """Nothing violated, but something checked was not scored: this check, or one of the merged batches,
        has no scored position (every prompt unscorable, every position unstable, nothing re-scored)."""
        return self.violations == 0 and (self.positions == 0 or bool(self.inconclusive_batches))

    @property
    def ok(self) -> bool:
        """Lossless: scored positions in every batch checked, and no violation."""
        return self.violations == 0 and not self.inconclusive

    @property
    def verdict(self) -> str:
        return "violations" if self.violations else "inconclusive" if self.inconclusive else "lossless"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["inconclusive"] = self.inconclusive
        d["verdict"] = self.verdict
        return d


AGREE, TIE, VIOLATION = 0, 1, 2


def classify(output: list[int], scored: list[dict[int, tuple[float, int]] | None],
             eps: float) -> list[tuple[int, Position | None] | None]:
    """Per output position: (AGREE|TIE|VIOLATION, the position's numbers) or None where the re-scoring
    has no entry for it. ``scored[j]``: the prefill's entries at output position j, token -> (logprob, rank)."""
    out: list[tuple[int, Position | None] | None] = []
    for j, token in enumerate(output):
        entries = scored[j] if j < len(scored) else None
        if not entries or token not in entries:
            out.append(None)
            continue
        lp, rank = entries[token]
        if rank == 1:
            out.append((AGREE, None))
            continue
        top1, (top_lp, _) = min(entries.items(), key=lambda kv: kv[1][1])
        pos = Position(j, token, top1, float(top_lp - lp))
        out.append((TIE if pos.margin <= eps else VIOLATION, pos))
    return out


def check(outputs: list[list[int]], passes: list[list[list[dict[int, tuple[float, int]] | None]]],
          eps: float = DEFAULT_EPS) -> Verdict:
    """``passes``: one or more independent re-scorings of the same outputs (the worker runs two, in opposite
    batch orders). A position is scored only where every pass has it and all judge it alike: it agrees
    only where every pass agrees, is a tie where every pass accepts it (agree or tie), a violation where
    every pass calls it one. One pass accepting what another calls a violation makes it ``unstable``:
    counted, not scored, and neither agreement nor a violation."""
    v = Verdict(eps=eps)
    for prompt_no, out in enumerate(outputs):
        classes = [classify(out, sc[prompt_no], eps) for sc in passes]
        v.prompts += 1
        if out and all(c and c[0] is not None and c[0][0] == VIOLATION for c in classes):
            v.unscorable += 1
            continue
        for j in range(len(out)):
            seen = [c[j] if j < len(c) else None for c in classes]
            if not seen or any(s is None for s in seen):
                continue  # a pass without this position: not judged alike by all
            kinds = {k for k, _ in seen}
            if VIOLATION in kinds and kinds != {VIOLATION}:
                v.unstable += 1
                continue
            v.positions += 1
            if kinds == {VIOLATION}:
                v.violations += 1
                if len(v.first_violations) < 8:
                    v.first_violations.append({"prompt": prompt_no, **asdict(seen[0][1])})
            elif TIE in kinds:
                v.ties += 1
                v.max_tie_margin = max(v.max_tie_margin, max(p.margin for k, p in seen if k == TIE))
    v.max_tie_margin = round(v.max_tie_margin, 4)
    return v


def merge(verdicts: dict[int, Verdict]) -> Verdict:
    """A set's verdict from its batches' (batch size -> verdict): the counts added up, and the batches
    that scored nothing named, so one inconclusive batch is not hidden by another's positions."""
    out = Verdict(eps=next(iter(verdicts.values())).eps if verdicts else DEFAULT_EPS)
    for batch, v in verdicts.items():
        out.prompts += v.prompts
        out.positions += v.positions
        out.ties += v.ties
        out.violations += v.violations
        out.unstable += v.unstable
        out.unscorable += v.unscorable
        out.max_tie_margin = max(out.max_tie_margin, v.max_tie_margin)
        out.first_violations += [{"batch": batch, **f} for f in v.first_violations[: 8 - len(out.first_violations)]]
        if v.positions == 0 or v.inconclusive_batches:
            out.inconclusive_batches.append(batch)
    return out
