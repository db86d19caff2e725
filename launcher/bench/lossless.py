"""Lossless, as a GPU can check it: every greedy token a run emitted is the target's argmax for its prefix.

On a GPU the verification batch's shape changes with the drafts, so its numerics differ from stock's
and byte identity with stock decoding is not what lossless means there. What a correct speculative
decoder guarantees under greedy sampling is that each emitted token is the target's top-1 given the
tokens before it. The check re-scores prompt + output in one prefill (vLLM's prompt logprobs, top-1
and the token's own) and looks at each output position:

* the emitted token is the prefill's argmax: agrees;
* it is not, but its logprob is within ``eps`` of the top-1 (the two were tied up to the difference
  between the prefill's and the decode's batch shapes): a tie, counted and reported with its margin;
* otherwise: a violation, which fails the check.

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
    max_tie_margin: float = 0.0
    first_violations: list[dict] = field(default_factory=list)   # up to 8, for the report
    eps: float = DEFAULT_EPS

    @property
    def ok(self) -> bool:
        return self.positions > 0 and self.violations == 0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def score_prompt(output: list[int], scored: list[dict[int, tuple[float, int]] | None],
                 eps: float) -> tuple[int, list[Position], list[Position]]:
    """``scored[j]``: the prefill's entries at output position j, token -> (logprob, rank). Returns
    (positions checked, ties, violations)."""
    ties: list[Position] = []
    bad: list[Position] = []
    checked = 0
    for j, token in enumerate(output):
        entries = scored[j] if j < len(scored) else None
        if not entries or token not in entries:
            continue
        checked += 1
        lp, rank = entries[token]
        if rank == 1:
            continue
        top1, (top_lp, _) = min(entries.items(), key=lambda kv: kv[1][1])
        pos = Position(j, token, top1, float(top_lp - lp))
        (ties if pos.margin <= eps else bad).append(pos)
    return checked, ties, bad


def check(outputs: list[list[int]], scored: list[list[dict[int, tuple[float, int]] | None]],
          eps: float = DEFAULT_EPS) -> Verdict:
    v = Verdict(eps=eps)
    for prompt_no, (out, sc) in enumerate(zip(outputs, scored)):
        n, ties, bad = score_prompt(out, sc, eps)
        v.prompts += 1
        v.positions += n
        v.ties += len(ties)
        v.violations += len(bad)
        if ties:
            v.max_tie_margin = max(v.max_tie_margin, max(t.margin for t in ties))
        for b in bad:
            if len(v.first_violations) < 8:
                v.first_violations.append({"prompt": prompt_no, **asdict(b)})
    v.max_tie_margin = round(v.max_tie_margin, 4)
    return v


def merge(verdicts: list[Verdict]) -> Verdict:
    out = Verdict(eps=verdicts[0].eps if verdicts else DEFAULT_EPS)
    for v in verdicts:
        out.prompts += v.prompts
        out.positions += v.positions
        out.ties += v.ties
        out.violations += v.violations
        out.max_tie_margin = max(out.max_tie_margin, v.max_tie_margin)
        out.first_violations += v.first_violations[: 8 - len(out.first_violations)]
    return out
