"""dynamic-draft's look-ahead: decide draft slot j while slot j+1's forward runs (``RADIANCE_DRAFT_LOOKAHEAD``).

With GPU tensors the slot's copy goes to pinned memory without waiting and the token goes back to
vLLM's loop at once, so the next slot's forward is queued before the host needs this slot's verdict;
the verdict is read in the next call, when the device is busy with that forward. A stop there drops
the forward that ran ahead (one that stock MTP would have run anyway); the drafts are the ones decided
without look-ahead. The slot that is the step's last whatever the controller sees (k, or the
schedule's cap) is decided at once: nothing runs past it. The step's n-gram continuations are read the
same way (``begin`` waits for the first decision), and the step's sampled tokens go into the context
mirror on the device (their host copy, for the acceptance counters, is read once the step is drafted).
Off on CPU, where every copy is synchronous and nothing would overlap.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .step_control import _Step

logger = logging.getLogger("radiance")


class _HostRing:
    """Pinned host rows and CUDA events, allocated once and reused every step: a device->host copy
    then costs the copy and an event record, no allocation (the pinned allocator and event creation
    cost more host time than the copy). Row ``NGRAM`` holds the step's n-gram continuations, ``CREDIT``
    its sampled tokens, ``SLOT + j`` draft slot j; each row is read (after its event) before the next
    copy into it is issued. Every copy is int32 (token ids, confidences' bits, flags); a CPU tensor
    takes a plain copy."""

    NGRAM, CREDIT, SLOT = 0, 1, 2

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None
        self.events: list = []
        self.views: dict[tuple, torch.Tensor] = {}  # (row, shape) -> its host view (a view costs µs too)

    def copy(self, row: int, t: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
        if not t.is_cuda:
            return t.to("cpu", copy=True), None
        assert t.dtype == torch.int32, t.dtype
        host = self.views.get((row, t.shape))
        if host is None:
            n = t.numel()
            if self.buf is None or self.buf.shape[0] <= row or self.buf.shape[1] < n:
                rows = max(row + 1, 0 if self.buf is None else self.buf.shape[0], self.SLOT + 8)
                width = max(n, 0 if self.buf is None else self.buf.shape[1], 256)
                self.buf = torch.empty((rows, width), dtype=torch.int32, pin_memory=True)
                self.events = [torch.cuda.Event() for _ in range(rows)]
                self.views.clear()
            host = self.views[(row, t.shape)] = self.buf[row, :n].view(t.shape)
        host.copy_(t, non_blocking=True)
        event = self.events[row]
        event.record()
        return host, event


def _host_wait(copy: tuple) -> np.ndarray:
    host, event = copy
    if event is not None:
        event.synchronize()
    return host.numpy()


class LookAhead:
    """The patch's side of look-ahead: when a step looks ahead, and the deferred decisions."""

    def _lookahead_for(self, t: torch.Tensor) -> bool:
        on = t.is_cuda if self.lookahead == "auto" else self.lookahead == "1"
        if not self._lookahead_said:
            self._lookahead_said = True
            if on:
                logger.info("radiance: dynamic-draft decides each draft slot while the next forward runs "
                            "(look-ahead; a stop drops the slot that ran ahead)")
            else:
                why = ("RADIANCE_DRAFT_LOOKAHEAD=0" if self.lookahead == "0" else
                       "CPU tensors are copied synchronously, there is no forward to overlap")
                logger.info("radiance: dynamic-draft look-ahead off (%s): each slot is decided before "
                            "the next forward", why)
        return on

    def _begin_now(self, step: _Step) -> None:
        """The deferred ``begin``: the n-gram continuations' copy has long arrived."""
        if step.ngram is not None:
            both = _host_wait(step.ngram)
            step.ngram = None
            step.ctl.begin(step.k, both[:, :step.k].tolist(), both[:, step.k].tolist())

    def _settle(self, step: _Step) -> str:
        """Decide the pending slot from its host copy: "done" (no request drafts any more),
        "drafting", or "latched" (TP>1: the slot's exchange said a rank faulted; every rank latches
        here). A failure here is after the exchange: it raises (the caller says how)."""
        j, copy, local_reason = step.pending
        step.pending = None
        host = _host_wait(copy)
        b = step.batch
        if host.shape[0] > 2 * b:  # TP>1, look-ahead: the faulted ranks came with the slot
            faulted = [r for r, f in enumerate(host[2 * b:].tolist()) if f]
            if faulted:
                self._agreed_latch(faulted, local_reason)
                return "latched"
        self._begin_now(step)
        done = step.ctl.observe(j, host[:b].tolist(), host[b:2 * b].view(np.float32).tolist())
        self.slots_observed += 1
        return "done" if done else "drafting"
