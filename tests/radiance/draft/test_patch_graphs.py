"""dynamic-draft's widening of Model Runner V2's CUDA-graph table: which graph a decode step replays, at
every batch size and depth. The table and the dispatch are vLLM 0.32's own (``CudaGraphManager``'s
``_init_candidates`` and ``dispatch``); only the capture is left out (it needs a GPU), so the managers are
built with the attributes those two read (``benchmarks/graph_misses.py``, which reads the benchmarks' step
lines with the same table), at the 27B profile's capture sizes and the schedule the launcher writes."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from radiance.draft import patch_graphs
from radiance.draft.patch_graphs import GraphHooks, widen
from radiance.draft.patch_scheduler import DynamicDraftPatch
from radiance.features import draft_depth_tiers

pytest.importorskip("vllm")
ROOT = Path(__file__).resolve().parents[3]
from vllm.config.compilation import CUDAGraphMode  # noqa: E402
from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager  # noqa: E402

from benchmarks.graph_misses import vllm_table  # noqa: E402  (the one builder of the table)
from launcher.profile import load_profile  # noqa: E402

SIZES_27B = json.loads(load_profile(ROOT / "profiles/qwen3.5-27b-dummy-tp1.yaml").vllm_args["compilation-config"]
                       )["cudagraph_capture_sizes"]

K = 4
FULL, PIECEWISE = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE


class Manager(CudaGraphManager):
    """vLLM's class, subclassed so that a test's hooks come off with the test."""


def _manager(cls=None, schedule=None, mode=None):
    return vllm_table(SIZES_27B, K, schedule, max_reqs=32, mode=mode, cls=cls)


def _step(m, batch: int, depth: int):
    """The graph a decode step of ``batch`` requests at ``depth`` drafts replays (V2 passes the uniform
    query length of an all-decode batch)."""
    q = depth + 1
    return m.dispatch(batch, batch * q, q, 0, max_query_len=q)


def _not_full(m, depth: int) -> list[int]:
    return [b for b in range(1, 33) if _step(m, b, depth).cg_mode != FULL]


@pytest.fixture
def widened():
    p = DynamicDraftPatch()
    p.hook(GraphHooks, owner=Manager)
    yield p
    p.revert()


def test_vllms_own_table_runs_steps_between_capture_sizes_piecewise_under_the_depth_schedule():
    """The gap the widening closes (if vLLM closes it, this fails and the hook has no more to do)."""
    stock = _manager()
    assert _not_full(stock, K) == []
    tiers = _manager(schedule=draft_depth_tiers(K))
    assert _not_full(tiers, 4) == [3, 6, 9, 11, 12, 17, 18, 19, 21, 22, 23, 24, 25]
    assert _not_full(tiers, 2) == [5, 9, 10, 12, 13, 17, 18, 19, 20, 21, 23, 24, 25, 26]
    assert _step(tiers, 6, 4).cg_mode == PIECEWISE and _step(stock, 6, 4).cg_mode == FULL


def test_widened_every_depth_replays_a_full_graph_at_every_batch_size(widened):
    m = _manager(Manager, schedule=draft_depth_tiers(K))
    assert {d: _not_full(m, d) for d in range(1, K + 1)} == {d: [] for d in range(1, K + 1)}
    assert widened.graphs.added > 0 and not widened.graphs.declined


def test_at_stocks_depth_the_widened_table_replays_stocks_graph(widened):
    stock, m = _manager(), _manager(Manager, schedule=draft_depth_tiers(K))
    assert [_step(m, b, K) for b in range(1, 33)] == [_step(stock, b, K) for b in range(1, 33)]
    assert _step(m, 6, K).num_tokens == 35   # 30 tokens padded to the 7-request graph, as stock does


def test_nothing_vllm_already_replays_as_a_full_graph_changes(widened):
    plain, m = _manager(schedule=draft_depth_tiers(K)), _manager(Manager, schedule=draft_depth_tiers(K))
    for depth in range(1, K + 1):
        for b in range(1, 33):
            if _step(plain, b, depth).cg_mode == FULL:
                assert _step(m, b, depth) == _step(plain, b, depth)
    # a step no depth's graph holds (not uniform: a prefill among decodes) still goes piecewise
    assert m.dispatch(3, 40, None, 0).cg_mode == PIECEWISE


def test_a_drafter_table_without_piecewise_graphs_stops_running_eagerly(widened):
    """The MTP speculator's prefill table has the target's modes; one built with full decode graphs only
    would run such a step eagerly (NONE) unwidened."""
    mode = CUDAGraphMode.FULL_DECODE_ONLY
    assert _step(_manager(schedule=draft_depth_tiers(K), mode=mode), 6, 4).cg_mode == CUDAGraphMode.NONE
    assert _step(_manager(Manager, schedule=draft_depth_tiers(K), mode=mode), 6, 4).cg_mode == FULL


def test_one_query_length_is_left_as_vllm_built_it(widened):
    assert _manager(Manager)._candidates == _manager()._candidates and widened.graphs.added == 0


def test_widening_that_raises_leaves_vllms_table_whole_and_says_so_once(widened, monkeypatch, caplog):
    def half_done(candidates, full):
        candidates.clear()
        raise ValueError("boom")

    monkeypatch.setattr(patch_graphs, "widen", half_done)
    with caplog.at_level(logging.WARNING, logger="radiance"):
        m = _manager(Manager, schedule=draft_depth_tiers(K))
        _manager(Manager, schedule=draft_depth_tiers(K))
    assert m._candidates == _manager(schedule=draft_depth_tiers(K))._candidates
    assert widened.graphs.declined == "ValueError: boom"
    assert [r.getMessage() for r in caplog.records].count(
        "radiance: dynamic-draft left vLLM's CUDA-graph table as it is (steps between two capture sizes may "
        "run piecewise): ValueError: boom") == 1


def test_widen_adds_after_the_full_candidates_and_before_the_piecewise_ones():
    m = _manager(schedule=draft_depth_tiers(K))
    descs = list(m._candidates[(30, 0)])
    modes = [d.cg_mode for d in descs]
    assert widen(m._candidates, m._capture_descs[FULL]) > 0
    after = m._candidates[(30, 0)]
    first_piecewise = [d.cg_mode for d in after].index(PIECEWISE)
    assert after[:modes.index(PIECEWISE)] == descs[:modes.index(PIECEWISE)]
    assert after[first_piecewise:] == descs[modes.index(PIECEWISE):]
    assert {d.uniform_token_count for d in after[:first_piecewise]} == {2, 3, 4, 5}
