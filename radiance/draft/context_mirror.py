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

The step's sampled tokens (vLLM proposes before its bookkeeping writes them to the host rows) are
written on the device, straight from the sampler's output: reading them on the host first would
stall the device between the target's forward and the first draft forward.
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
        # grown on demand: max_num_seqs x max_model_len int32 is GBs at long context. One row more
        # than there are requests: where the sampled tokens that are not tokens (-1) are written.
        self.tokens = torch.zeros(max_rows + 1, width, dtype=torch.int32, device=self.device)
        self._seen: dict[str, tuple[int, int]] = {}
        self.copied_last_step = 0  # tokens moved by the last update (tests, telemetry)

    def _grow(self, need: int) -> None:
        width = self.tokens.shape[1]
        if need <= width:
            return
        new_width = min(self.max_len, max(need, 2 * width))
        grown = torch.zeros(self.max_rows + 1, new_width, dtype=torch.int32, device=self.device)
        grown[:, :width] = self.tokens
        self.tokens = grown

    def update(self, req_ids: Sequence[str], token_ids: np.ndarray, num_tokens: np.ndarray,
               sampled: torch.Tensor | None = None, discard: np.ndarray | None = None) -> torch.Tensor:
        """Bring rows ``0..len(req_ids)-1`` up to date. ``token_ids[i, :num_tokens[i]]`` are
        request ``req_ids[i]``'s tokens (vLLM's host arrays, row i = batch row i); ``sampled[i]``
        (on the device, -1 past the tokens kept) follow them but are not in the host arrays yet
        (vLLM proposes before its bookkeeping writes the step's accepted tokens); rows where
        ``discard[i]`` (still in chunked prefill) take none. Returns the token counts
        (``num_tokens`` + the sampled tokens taken) as an int32 device tensor, for the matcher.

        Only host-array tokens count as mirrored: sampled ones are written again from the host
        array once it holds them, so a wrong guess about them cannot outlive a step."""
        b = len(req_ids)
        if b > self.max_rows:
            raise ValueError(f"{b} requests but the mirror has {self.max_rows} rows")
        seen = self._seen
        counts = np.asarray(num_tokens[:b], dtype=np.int64)
        width_sampled = int(sampled.shape[1]) if sampled is not None else 0
        if b and int(counts.max()) > self.max_len:
            raise ValueError(f"a request has {int(counts.max())} tokens, mirror max {self.max_len}")
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

        new = sum(e - s for s, e in zip(starts, stops))
        self.copied_last_step = new
        if b:
            self._grow(min(self.max_len, int(counts.max()) + width_sampled))
        width = self.tokens.shape[1]
        # One packed transfer: [counts (b) | flat positions (new) | values (new)].
        packed = np.empty(b + 2 * new, dtype=np.int32)
        packed[:b] = counts
        if new:
            pos = packed[b:b + new]
            val = packed[b + new:]
            o = 0
            for i, s, e in zip(rows, starts, stops):
                m = e - s
                pos[o:o + m] = np.arange(i * width + s, i * width + e, dtype=np.int32)
                val[o:o + m] = token_ids[i, s:e]
                o += m
        dev = torch.from_numpy(packed).to(self.device)  # synchronous: packed dies with this call
        flat_tokens = self.tokens.view(-1)
        if new:
            flat_tokens.index_copy_(0, dev[b:b + new].long(), dev[b + new:])
        n_dev = dev[:b]
        if sampled is not None and b and width_sampled:
            tok = sampled[:b].to(device=self.device, dtype=torch.int32)
            keep = tok >= 0
            if discard is not None and bool(np.any(discard[:b])):
                keep &= ~torch.from_numpy(np.asarray(discard[:b], dtype=bool)).to(self.device)[:, None]
            rows_dev = torch.arange(b, device=self.device, dtype=torch.int64)[:, None]
            cols = n_dev.long()[:, None] + torch.arange(width_sampled, device=self.device)[None, :]
            keep &= cols < width  # a request at the model's length limit: no room, and none needed
            # no host sync: what is not kept goes to the spare row, which nothing reads
            where = torch.where(keep, rows_dev * width + cols, torch.full_like(cols, self.max_rows * width))
            flat_tokens.index_copy_(0, where.reshape(-1), tok.reshape(-1))
            n_dev = n_dev + keep.sum(dim=1, dtype=torch.int32)
        return n_dev

    def rows(self, b: int) -> torch.Tensor:
        """The first ``b`` rows of the mirror, the matcher's ``ctx``."""
        return self.tokens[:b]
