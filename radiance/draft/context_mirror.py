"""Each request's token history, kept on the device for the n-gram matcher.

vLLM keeps the tokens of the running requests in a host array, one row per batch slot. The
matcher runs on the device, so the mirror copies what is new since the last step: O(new tokens)
per step, not O(context).

What the mirror remembers per request is the pair (row, tokens mirrored), never the count
alone. vLLM reuses and reshuffles batch rows as requests come and go (condensing after a
finish, swapping on reorder), so a request can land on a row that still holds the previous
occupant's tokens; a count keyed by request id alone would leave that stale text in place and
the matcher would search another request's context. A request found on a different row than
last time is copied again from token 0.

The copy is one synchronous host-to-device transfer from pageable memory per step. The packed
buffer is a temporary: an asynchronous copy could still be reading it after it is freed, which
would put nondeterministic garbage in the mirror.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


class ContextMirror:
    def __init__(self, max_rows: int, max_len: int, device: torch.device | str,
                 initial_len: int = 4096) -> None:
        if max_rows * max_len >= 2**31:
            raise ValueError("positions are packed as int32: max_rows * max_len must be < 2**31")
        self.max_rows = max_rows
        self.max_len = max_len
        self.device = torch.device(device)
        width = min(max_len, max(16, initial_len))
        # grown on demand: max_num_seqs x max_model_len int32 is GBs at long context
        self.tokens = torch.zeros(max_rows, width, dtype=torch.int32, device=self.device)
        self._seen: dict[str, tuple[int, int]] = {}
        self.copied_last_step = 0  # tokens moved by the last update (tests, telemetry)

    def _grow(self, need: int) -> None:
        width = self.tokens.shape[1]
        if need <= width:
            return
        new_width = min(self.max_len, max(need, 2 * width))
        grown = torch.zeros(self.max_rows, new_width, dtype=torch.int32, device=self.device)
        grown[:, :width] = self.tokens
        self.tokens = grown

    def update(self, req_ids: Sequence[str], token_ids: np.ndarray, num_tokens: np.ndarray,
               extra: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Bring rows ``0..len(req_ids)-1`` up to date. ``token_ids[i, :num_tokens[i]]`` are
        request ``req_ids[i]``'s tokens (vLLM's host arrays, row i = batch row i); ``extra[i]``
        are tokens that follow them but are not in the host arrays yet (vLLM proposes before
        its bookkeeping writes the step's accepted tokens). Returns the token counts
        (``num_tokens + len(extra)``) as an int32 device tensor, ready for the matcher.

        Only host-array tokens count as mirrored: extras are written again from the host
        array once it holds them, so a wrong guess about them cannot outlive a step."""
        b = len(req_ids)
        if b > self.max_rows:
            raise ValueError(f"{b} requests but the mirror has {self.max_rows} rows")
        seen = self._seen
        counts = np.asarray(num_tokens[:b], dtype=np.int64)
        total = counts.copy()
        if extra is not None:
            total += np.fromiter((len(e) for e in extra[:b]), dtype=np.int64, count=b)
        if b and int(total.max()) > self.max_len:
            raise ValueError(f"a request has {int(total.max())} tokens, mirror max {self.max_len}")
        rows, starts, stops = [], [], []
        for i, rid in enumerate(req_ids):
            n = int(counts[i])
            prev = seen.get(rid)
            s = prev[1] if prev is not None and prev[0] == i else 0
            if n > s:
                rows.append(i)
                starts.append(s)
                stops.append(n)
            seen[rid] = (i, n)
        if len(seen) > b:
            live = set(req_ids)
            for rid in [r for r in seen if r not in live]:
                del seen[rid]

        host_new = sum(e - s for s, e in zip(starts, stops))
        extra_new = int(total.sum() - counts.sum()) if b else 0
        new = host_new + extra_new
        self.copied_last_step = new
        if b:
            self._grow(int(total.max()))
        # One packed transfer: [counts (b) | flat positions (new) | values (new)].
        packed = np.empty(b + 2 * new, dtype=np.int32)
        packed[:b] = total
        if new:
            width = self.tokens.shape[1]
            pos = packed[b:b + new]
            val = packed[b + new:]
            o = 0
            for i, s, e in zip(rows, starts, stops):
                m = e - s
                pos[o:o + m] = np.arange(i * width + s, i * width + e, dtype=np.int32)
                val[o:o + m] = token_ids[i, s:e]
                o += m
            if extra_new:
                for i in range(b):
                    ex = extra[i]
                    m = len(ex)
                    if m:
                        s = int(counts[i])
                        pos[o:o + m] = np.arange(i * width + s, i * width + s + m, dtype=np.int32)
                        val[o:o + m] = ex
                        o += m
        dev = torch.from_numpy(packed).to(self.device)  # synchronous: packed dies with this call
        if new:
            flat = dev[b:b + new].long()
            self.tokens.view(-1).index_copy_(0, flat, dev[b + new:])
        return dev[:b]

    def rows(self, b: int) -> torch.Tensor:
        """The first ``b`` rows of the mirror, the matcher's ``ctx``."""
        return self.tokens[:b]
