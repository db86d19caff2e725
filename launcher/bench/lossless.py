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

A prompt whose first output token is a violation in every pass is set aside as *unscorable*: that token
comes from the target's own prefill of the prompt, before any draft exists, so a re-scoring that
disagrees with it is disagreeing with the engine's prefill, not with speculative decoding (seen on the
H200 for a lone re-scored request: every position off by 3-9 nats, the first included). Such prompts are
counted and reported; a check left with no scorable prompt is inconclusive, never a pass.

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
    positions: int = 0
    ties: int = 0
    violations: int = 0
    unstable: int = 0       # positions the independent re-scorings classify differently
    unscorable: int = 0     # prompts whose re-scoring disagrees with the engine's prefill (position 0)
    max_tie_margin: float = 0.0
    first_violations: list[dict] = field(default_factory=list)   # up to 8, for the report
    eps: float = DEFAULT_EPS

    @property
    def ok(self) -> bool:
        return self.positions > 0 and self.violations == 0

    @property
    def inconclusive(self) -> bool:
        """Nothing could be scored because every prompt's re-scoring disagreed with the prefill."""
        return self.positions == 0 and self.unscorable > 0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        d["inconclusive"] = self.inconclusive
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
    batch orders). A position counts by the most favourable pass: a token the target really did not choose
    is a violation in every pass, while a re-scoring that went wrong for one request (its batch slot, its
    state) does not repeat in the other order. Positions the passes disagree on are counted as ``unstable``."""
    v = Verdict(eps=eps)
    for prompt_no, out in enumerate(outputs):
        classes = [classify(out, sc[prompt_no], eps) for sc in passes]
        v.prompts += 1
        if out and all(c and c[0] is not None and c[0][0] == VIOLATION for c in classes):
            v.unscorable += 1
            continue
        for j in range(len(out)):
            seen = [c[j] for c in classes if j < len(c) and c[j] is not None]
            if not seen:
                continue
            v.positions += 1
            if len({k for k, _ in seen}) > 1:
                v.unstable += 1
            kind, pos = min(seen, key=lambda kp: kp[0])
            if kind == TIE:
                v.ties += 1
                v.max_tie_margin = max(v.max_tie_margin, pos.margin)
            elif kind == VIOLATION:
                v.violations += 1
                if len(v.first_violations) < 8:
                    v.first_violations.append({"prompt": prompt_no, **asdict(pos)})
    v.max_tie_margin = round(v.max_tie_margin, 4)
    return v


def merge(verdicts: list[Verdict]) -> Verdict:
    out = Verdict(eps=verdicts[0].eps if verdicts else DEFAULT_EPS)
    for v in verdicts:
        out.prompts += v.prompts
        out.positions += v.positions
        out.ties += v.ties
        out.violations += v.violations
        out.unstable += v.unstable
        out.unscorable += v.unscorable
        out.max_tie_margin = max(out.max_tie_margin, v.max_tie_margin)
        out.first_violations += v.first_violations[: 8 - len(out.first_violations)]
    return out
