"""The context mirror: O(new tokens) per step, and correct when vLLM reuses or reshuffles rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radiance.draft.context_mirror import ContextMirror
from radiance.kernels.ngram_match import ngram_match_reference

MAX_ROWS, MAX_LEN = 4, 64


class Batch:
    """A stand-in for vLLM's input batch: host token rows that requests occupy and leave."""

    def __init__(self):
        self.tokens = np.full((MAX_ROWS, MAX_LEN), -7, dtype=np.int32)  # -7: never written
        self.n = np.zeros(MAX_ROWS, dtype=np.int32)
        self.req_ids: list[str] = []
        self.text: dict[str, list[int]] = {}

    def place(self, row, rid):
        """Put request rid on row (vLLM copies its tokens to the row, leaving the rest as is)."""
        toks = self.text[rid]
        self.tokens[row, :len(toks)] = toks
        self.n[row] = len(toks)
        while len(self.req_ids) <= row:
            self.req_ids.append("")
        self.req_ids[row] = rid

    def grow(self, rid, new):
        self.text[rid].extend(new)
        row = self.req_ids.index(rid)
        self.place(row, rid)

    def check(self, mirror):
        n = mirror.update(self.req_ids, self.tokens, self.n)
        assert n.tolist() == self.n[:len(self.req_ids)].tolist()
        for row, rid in enumerate(self.req_ids):
            got = mirror.tokens[row, :self.n[row]].tolist()
            assert got == self.text[rid], f"row {row} ({rid}) is stale"
        return n


def test_only_new_tokens_are_copied():
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu", initial_len=16)
    b.text = {"a": [1, 2, 3, 4], "b": [5, 6]}
    b.place(0, "a")
    b.place(1, "b")
    b.check(m)
    assert m.copied_last_step == 6
    b.grow("a", [7, 8])
    b.grow("b", [9])
    b.check(m)
    assert m.copied_last_step == 3
    b.check(m)
    assert m.copied_last_step == 0


def test_rows_swapped_between_steps():
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu")
    b.text = {"a": [1, 2, 3, 4, 5], "b": [9, 9]}
    b.place(0, "a")
    b.place(1, "b")
    b.check(m)
    b.place(0, "b")  # vLLM swaps the two rows; each row's tail keeps the other's old tokens
    b.place(1, "a")
    b.check(m)
    assert m.copied_last_step == 7


def test_row_reused_by_a_new_request_after_a_finish():
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu")
    b.text = {"old": [4, 4, 4, 1, 2, 3, 4, 4, 4, 5, 6], "keep": [1]}
    b.place(0, "old")
    b.place(1, "keep")
    b.check(m)
    # "old" finishes; the condensed batch moves "keep" down and a new request takes row 1
    b.text["new"] = [8, 4, 4, 4]
    b.req_ids = []
    b.place(0, "keep")
    b.place(1, "new")
    n = b.check(m)  # a count kept per request id alone would leave "old"'s 4 on row 0
    # "new"'s trailing 4,4,4 occurs only in the previous occupants' text, never in its own
    cont, clen = ngram_match_reference(m.rows(2), n, k=4, ngram=3)
    assert clen.tolist() == [0, 0]


def test_request_returns_to_its_row_after_another_used_it():
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu")
    b.text = {"a": [1, 2, 3], "x": [7, 7, 7, 7, 7]}
    b.place(0, "a")
    b.check(m)
    b.req_ids = []
    b.place(0, "x")  # "a" preempted, "x" runs on row 0
    b.check(m)
    b.req_ids = []
    b.place(0, "a")  # "a" resumes on the same row: the mirror must not trust its old count
    b.check(m)


def test_mirror_grows_and_rejects_overflow():
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu", initial_len=16)
    b.text = {"a": list(range(40))}
    b.place(0, "a")
    b.check(m)
    assert m.tokens.shape[1] >= 40
    with pytest.raises(ValueError):
        m.update(["a", "b", "c", "d", "e"], b.tokens, np.zeros(5, dtype=np.int32))


def test_random_churn_matches_the_host_rows():
    rng = np.random.default_rng(0)
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu", initial_len=16)
    live: list[str] = []
    serial = 0
    for _ in range(200):
        op = rng.integers(4)
        if op == 0 and len(live) < MAX_ROWS:
            serial += 1
            rid = f"r{serial}"
            b.text[rid] = rng.integers(0, 5, rng.integers(1, 10)).tolist()
            live.append(rid)
        elif op == 1 and live:
            live.pop(int(rng.integers(len(live))))
        elif op == 2 and len(live) > 1:
            rng.shuffle(live)
        for rid in live:
            if len(b.text[rid]) < MAX_LEN - 3:
                b.text[rid].extend(rng.integers(0, 5, rng.integers(0, 3)).tolist())
        b.req_ids = []
        for row, rid in enumerate(live):
            b.place(row, rid)
        b.req_ids = list(live)
        b.check(m)
        if live:
            n = torch.from_numpy(b.n[:len(live)].copy())
            host = torch.from_numpy(b.tokens[:len(live)].copy())
            assert all(torch.equal(x, y) for x, y in zip(
                ngram_match_reference(m.rows(len(live)), n, 4, 2),
                ngram_match_reference(host, n, 4, 2)))


def test_tokens_not_yet_in_the_host_rows():
    # vLLM proposes before its bookkeeping writes the step's accepted tokens to the host rows:
    # they come as ``extra`` and count, but the host rows stay the truth next step
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu")
    b.text = {"a": [1, 2, 3]}
    b.place(0, "a")
    n = m.update(b.req_ids, b.tokens, b.n, sampled=torch.tensor([[4, 5, -1]]))
    assert n.tolist() == [5] and m.tokens[0, :5].tolist() == [1, 2, 3, 4, 5]
    b.grow("a", [4, 9])  # bookkeeping wrote what was really kept (here: not what we guessed)
    b.check(m)
    assert m.copied_last_step == 2


def test_sampled_tokens_of_a_row_in_chunked_prefill_are_not_taken():
    b, m = Batch(), ContextMirror(MAX_ROWS, MAX_LEN, "cpu")
    b.text = {"a": [1, 2, 3], "c": [7, 8]}
    b.place(0, "a")
    b.place(1, "c")
    n = m.update(b.req_ids, b.tokens, b.n, sampled=torch.tensor([[4, -1, -1], [9, 9, -1]]),
                 discard=np.array([False, True]))
    assert n.tolist() == [4, 2]
    assert m.tokens[0, :4].tolist() == [1, 2, 3, 4] and m.tokens[1, :2].tolist() == [7, 8]
    assert m.rows(2).shape[0] == 2   # the spare row (where -1 and discarded tokens go) is not a request's


def test_sampled_tokens_past_the_length_limit_are_dropped_not_an_error():
    m = ContextMirror(2, 6, "cpu", initial_len=6)
    n = m.update(["a"], np.array([[1, 2, 3, 4, 5, 0]], dtype=np.int32), np.array([5]),
                 sampled=torch.tensor([[6, 7, 8]]))
    assert n.tolist() == [6] and m.tokens[0].tolist() == [1, 2, 3, 4, 5, 6]
