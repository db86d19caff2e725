"""Which draft depth the next step runs: the one that has been making the most tokens per second.

The scheduler asks before every step (``choose(batch_size)``), on the host, from what finished steps
already told it, so nothing waits for the GPU. Per batch-size bucket (1, 2, 3-4, 5-8, 9-16, ...) the
policy keeps, for each candidate depth d, how many request-steps per second the engine ran at d (timed
between consecutive finished steps that were pure decode at d). Times the tokens a request is expected
to gain at d (``AcceptanceEstimate``), that is the throughput the depth is worth; the policy runs the
best. Measured rather than modelled: the price of a depth includes what no model here knows, such as
what an MTP forward costs beside the target's verification at this batch size on this GPU.

A depth not yet measured in a bucket is probed: held for ``probe_steps`` steps, the configured depth first,
then the shallowest (the speed bound below), then the rest. Then the next depth other than the best is
probed again after 16 steps of the bucket, the interval doubling up to ``reprobe_every``: an early
misjudgement is corrected early, and a change of traffic or of the acceptance at deeper positions is seen
later on. A depth's speed is the median of its last fifteen timed steps, its very first one dropped.

Steps jitter (on the H100 the trained tiny model's host-bound steps moved by up to 40% between repeats), and a
probe's few steps can make a worse depth look ahead: there the policy drafted depth 3 at B = 8 and lost 22%
to stock (docs/benchmarks.md, ninth session). So a depth other than the configured one runs only once its
lead is beyond the noise (``_best``), and until then the configured depth runs and the leader is timed
further.

A probe is not free: its steps give up the tokens the best depth would have made. On the H100 at 27B shapes
with code-like acceptance, probes of depths 1-3 made the feature lose to stock (docs/benchmarks.md, eighth
session). So once the shallowest candidate is measured, a depth is probed only if it could win: a shallower
depth saves MTP forwards, never the verification, so no depth steps faster than the fastest one measured,
and a depth whose expected tokens at that speed fall short of the best's worth cannot be the best. Deeper
depths than the best always pass (they make more tokens), so the acceptance of deep positions is still seen.
The shallowest itself, and any shallower depth in a bucket that has not timed the shallowest, is bounded by
its speed relative to the best's, from this bucket or the nearest one that timed both (or, for a depth
never timed, on the line between the shallowest's step time and the best's), with ``HEADROOM`` for drift:
in the tenth session the shallowest's re-probes, and its first probes in the bucket a B = 32 batch passes
through as its requests finish, still cost 7% of a code-like B = 32 run at 27B shapes.

The seeds' tau keeps its intent: a depth whose last position (or the one before it) is estimated, from at
least 32 drafts, to be accepted less often than tau is not a candidate (stop drafting where acceptance is
unlikely). The position before counts because a rate per position is unconditional, so it never rises with
depth: at 27B shapes with nothing accepted, depth 2 otherwise ran 48 of 64 steps at B = 1 while its own
position gathered the evidence (docs/benchmarks.md, fifteenth session). The re-probes
still visit it, since a position's acceptance is only seen while it is drafted (without both rules one bad
first step ruled depths 2-4 out for good on the tiny model). A position not drafted keeps its rate given the
position before (acceptance.py), so it rises again with that position's, and its evidence fades as drafts come
in: tau's verdict on it lapses after ~110 drafts without it. The batch-size schedule caps the depth.

Pure host logic: no torch, no vLLM; time is passed in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from .acceptance import AcceptanceEstimate

PROBE_STEPS = 3
REPROBE_EVERY = 256
WARMUP_STEPS = 2     # steps of a bucket at the configured depth before any probe
MIN_SAMPLES = 2      # clean steps before a depth's speed counts
MAX_PROBES = 3       # probes of a depth that yielded no clean step before it is left out of the bucket
WINDOW = 15          # a depth's speed is the median of its last few samples: one slow step moves nothing
FIRST_REPROBE = 16   # steps of a bucket before its first re-probe; the interval doubles up to reprobe_every
OUTLIER = 4.0        # a gap this many times the cell's step time is an idle engine, not a step
MARGIN = 0.02        # how much more than stock's depth another must be worth, beyond the noise, to run instead
MEDIAN_SE = 1.25     # a median's standard error over the mean's, for normal noise
TAU_EVIDENCE = 32.0  # drafts that must have reached a position before tau may rule it out
HEADROOM = 0.25      # how much faster, relative to the best, a shallower depth may step than it was timed to


def _relative_noise(speeds) -> float:
    """The relative spread of one timed step around its depth's median, pooled over a bucket's depths
    (1.4826 x the median absolute deviation: a standard deviation that one stalled step does not move)."""
    devs = []
    for s in speeds:
        if s.samples >= 2:
            m = s.rate   # a median: sorted once per depth, not once per sample
            devs += [abs(x - m) / m for x in s.recent]
    devs.sort()
    return 1.4826 * devs[len(devs) // 2] if devs else 0.0


def bucket(batch_size: int) -> int:
    """The smallest power of two >= batch_size."""
    b = 1
    while b < batch_size:
        b <<= 1
    return b


def depth_cap(schedule: Sequence[tuple[int, int]], batch_size: int) -> int | None:
    """The schedule's depth at ``batch_size``: the largest entry whose batch size is <= it (carry-forward);
    below the first entry, the first depth. None for an empty schedule."""
    if not schedule:
        return None
    depth = schedule[0][1]
    for bs, d in schedule:
        if batch_size >= bs:
            depth = d
        else:
            break
    return max(1, depth)


@dataclass
class _Speed:
    """Request-steps per second at one depth in one bucket. The first clean step a depth ever runs is
    dropped (it can carry one-time costs: a kernel compiled, a buffer allocated). On the H200 the policy
    once kept depth 1 where the configured depth stepped as fast; a corrupted first sample of the
    configured depth is the explanation that fits what was logged (not seen directly): a median cannot be
    moved by one such step, and the early re-probes correct what it would have settled."""
    recent: list[float] = field(default_factory=list)
    seen: int = 0

    @property
    def samples(self) -> int:
        return len(self.recent)

    @property
    def rate(self) -> float:
        r = sorted(self.recent)
        return r[len(r) // 2] if len(r) % 2 else 0.5 * (r[len(r) // 2 - 1] + r[len(r) // 2])

    def add(self, rate: float) -> None:
        self.seen += 1
        if self.seen == 1:
            return
        self.recent = (self.recent + [rate])[-WINDOW:]


@dataclass
class _Bucket:
    size: int = 1
    speed: dict[int, _Speed] = field(default_factory=dict)
    probes: dict[int, int] = field(default_factory=dict)   # depth -> probes started
    steps: int = 0
    probe: int | None = None
    probe_left: int = 0
    next_reprobe: int = FIRST_REPROBE
    interval: int = FIRST_REPROBE                         # doubles after each re-probe, up to reprobe_every
    last_probe: dict[int, int] = field(default_factory=dict)  # depth -> the bucket step its last probe began
    reprobes: int = 0
    best: int | None = None                               # the best depth when last asked


@dataclass
class Decision:
    depth: int
    probe: bool


class DepthPolicy:
    def __init__(self, k: int, tau: float = 0.0, schedule: Sequence[tuple[int, int]] = (),
                 probe_steps: int = PROBE_STEPS, reprobe_every: int = REPROBE_EVERY) -> None:
        if k < 1:
            raise ValueError(f"num_speculative_tokens is {k}")
        self.k = k
        self.tau = tau
        self.schedule = tuple(schedule)
        self.probe_steps = probe_steps
        self.reprobe_every = reprobe_every
        self.acceptance = AcceptanceEstimate(k)
        self._buckets: dict[int, _Bucket] = {}
        self._last: tuple[float, int] | None = None   # (time, bucket) of the last clean step

    # -- the scheduler's question ----------------------------------------------------------------
    def candidates(self, batch_size: int) -> list[int]:
        out = []
        for d in range(1, self._cap(batch_size) + 1):
            # position d is accepted no more often than position d - 1 (an unconditional rate): a first
            # position under tau rules out depth 2 before depth 2 has drafted enough to say so itself
            if d > 1 and (self._under_tau(d) or self._under_tau(d - 1)):
                break   # deeper positions are accepted less often still
            out.append(d)
        return out

    def _under_tau(self, position: int) -> bool:
        r = self.acceptance.rate(position)
        return r is not None and r < self.tau and self.acceptance.evidence(position) >= TAU_EVIDENCE

    def _cap(self, batch_size: int) -> int:
        return min(depth_cap(self.schedule, batch_size) or self.k, self.k)

    def choose(self, batch_size: int) -> Decision:
        b = bucket(batch_size)
        st = self._buckets.get(b)
        if st is None:
            st = self._buckets[b] = _Bucket(size=b)
        st.steps += 1
        cands = self.candidates(batch_size)
        if st.probe is not None and st.probe <= self._cap(batch_size) and st.probe_left > 0:
            st.probe_left -= 1
            return Decision(st.probe, True)
        st.probe = None
        worth = self._worth(st, cands)
        best, leader = self._best(st, worth, cands[-1])
        if best != st.best:
            # the traffic moved (or the first measures came in): look around again soon
            st.best, st.interval = best, FIRST_REPROBE
            st.next_reprobe = min(st.next_reprobe, st.steps + FIRST_REPROBE)
        if st.steps > WARMUP_STEPS:
            # the configured depth (what stock runs), then the shallowest (the bound), then the rest
            order = sorted(cands, key=lambda d: (d != cands[-1], d))
            todo = [d for d in order if not self._measured(st, d) and st.probes.get(d, 0) < MAX_PROBES
                    and d != best and self._could_win(st, d, cands, worth, best)]
            if todo:
                return self._start_probe(st, todo[0])
            if leader is not None and st.speed[leader].samples < WINDOW:
                return self._start_probe(st, leader)   # ahead, not yet beyond the noise: time it further
            if st.steps >= st.next_reprobe:
                st.interval = min(2 * st.interval, self.reprobe_every)
                st.next_reprobe = st.steps + st.interval
                # every depth under the cap, those tau ruled out too: their acceptance is only seen when drafted
                others = [d for d in range(1, self._cap(batch_size) + 1)
                          if d != best and self._could_win(st, d, cands, worth, best)]
                if others:
                    # deeper and shallower depths in turn, each side's longest unprobed first: a deeper depth's
                    # worth hides in positions seen only while drafted, a shallower one's only in its speed
                    st.reprobes += 1
                    sides = [[d for d in others if d > best], [d for d in others if d < best]]
                    side = next(x for x in sides[st.reprobes % 2:] + sides[:st.reprobes % 2] if x)
                    return self._start_probe(st, min(side, key=lambda d: (st.last_probe.get(d, -1), d)))
        return Decision(best, False)

    @staticmethod
    def _best(st: _Bucket, worth: dict[int, float], stock: int) -> tuple[int, int | None]:
        """The depth to run, and a leader still to be confirmed (or None). The depth worth the most runs
        unless its lead over the deepest candidate (what stock runs) is within what the step-time noise
        allows: ``MARGIN`` plus one standard error of the two speeds' ratio (their medians' errors, from the
        spread of every timed step in the bucket). Until then stock's depth runs and the leader is named, to
        be timed further: a lead from a probe's few steps is mostly noise where steps jitter (the trained
        tiny model's steps on the H100 did by up to 40%), and a wrong switch away from stock costs the run."""
        if not worth:
            return stock, None   # unmeasured: what stock runs
        best = max(worth, key=lambda d: (worth[d], d))
        if best == stock or stock not in worth:
            return best, None
        noise = _relative_noise(st.speed.values())
        se = [MEDIAN_SE * noise / math.sqrt(st.speed[d].samples) for d in (best, stock)]
        if worth[best] > (1 + MARGIN + math.hypot(*se)) * worth[stock]:
            return best, None
        return stock, best

    def _start_probe(self, st: _Bucket, depth: int) -> Decision:
        st.probes[depth] = st.probes.get(depth, 0) + 1
        st.last_probe[depth] = st.steps
        st.probe, st.probe_left = depth, self.probe_steps - 1
        return Decision(depth, True)

    def _could_win(self, st: _Bucket, depth: int, cands: list[int], worth: dict[int, float], best: int) -> bool:
        """Whether ``depth`` could beat ``best``. A deeper depth always could. A shallower one: at the fastest
        speed measured in this bucket once the shallowest candidate (the fastest by construction) is
        measured; the shallowest itself, or any before it is measured, at its speed relative to the best's
        (``_speed_ratio``) plus ``HEADROOM``. Unknown means yes."""
        e, e_best = self.acceptance.expected_tokens(depth), self.acceptance.expected_tokens(best)
        if e is None or e_best is None or depth > best:
            return True
        if best in worth and depth != cands[0] and self._measured(st, cands[0]):
            fastest = max(st.speed[d].rate for d in cands if self._measured(st, d))
            return e * fastest >= worth[best]
        ratio = self._speed_ratio(st, depth, best, cands[0])
        return ratio is None or e * ratio * (1 + HEADROOM) >= e_best

    def _speed_ratio(self, st: _Bucket, depth: int, best: int, shallowest: int) -> float | None:
        """How many times faster ``depth`` steps than ``best``: from this bucket, else the nearest (by batch
        size) that timed both; failing that, from the nearest that timed the shallowest and the best, with the
        step time taken on the line between theirs (each MTP forward costs alike; for this bound only).
        None where no bucket has timed enough."""
        near = sorted(self._buckets.values(), key=lambda o: (o is not st, abs(math.log2(o.size / st.size))))
        for o in near:
            if self._measured(o, depth) and self._measured(o, best):
                return o.speed[depth].rate / o.speed[best].rate
        for o in near:   # shallowest <= depth < best: the line has two distinct ends
            if self._measured(o, shallowest) and self._measured(o, best):
                t = o.speed[best].rate / o.speed[shallowest].rate   # the shallowest's step time over the best's
                return 1.0 / (t + (depth - shallowest) / (best - shallowest) * (1.0 - t))
        return None

    def _measured(self, st: _Bucket, depth: int) -> bool:
        s = st.speed.get(depth)
        return s is not None and s.samples >= MIN_SAMPLES and self.acceptance.expected_tokens(depth) is not None

    def _worth(self, st: _Bucket, cands: list[int]) -> dict[int, float]:
        """Expected tokens per second of each measured candidate."""
        return {d: self.acceptance.expected_tokens(d) * st.speed[d].rate for d in cands if self._measured(st, d)}

    def worth(self, batch_size: int) -> dict[int, float]:
        """Expected tokens per second of each measured candidate at this batch size (telemetry, tests)."""
        st = self._buckets.get(bucket(batch_size))
        return self._worth(st, self.candidates(batch_size)) if st is not None else {}

    # -- what a finished step told the scheduler -------------------------------------------------
    def observe(self, now: float, batch_size: int, drafted: Sequence[int], accepted: Sequence[int],
                depth: int, clean: bool) -> None:
        """A finished step: per request the drafts it verified (those the drafter made, not the padding)
        and how many were accepted; ``depth`` the drafts the step made for the next one; ``clean`` whether
        every request was a plain decode (so the step's time is the price of that depth)."""
        if drafted:
            self.acceptance.observe(drafted, accepted)
        b = bucket(batch_size)
        last, self._last = self._last, (now, b) if clean else None
        if not clean or last is None or last[1] != b:
            return
        dt = now - last[0]
        if dt <= 0:
            return
        st = self._buckets.get(b)
        if st is None:
            return
        speed = st.speed.setdefault(depth, _Speed())
        if speed.samples and dt > OUTLIER * batch_size / speed.rate:
            return
        speed.add(batch_size / dt)
