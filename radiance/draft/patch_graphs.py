"""dynamic-draft in Model Runner V2's CUDA-graph dispatch: a step at any depth the policy picks replays a
full graph wherever stock's step at its depth would.

Under a per-batch-size schedule (the one the launcher writes names every depth 1..k) V2 captures full
graphs for each depth's query length, and ``CudaGraphManager._init_candidates`` files every graph under
the token counts it covers. It groups the graphs by size across all query lengths: a step of T tokens
looks only among the graphs of the smallest captured size >= T, whatever their query length. Where that
size has no graph of the step's query length, vLLM 0.32 runs the step piecewise (or eagerly, for a
drafter with no piecewise mode), though a full graph of that length a little larger was captured. At the
27B profile's capture sizes that is depth 4 at B = 3, 6, 9, 11, 12, 17-19, 21-25 and depth 2 at 14 batch
sizes up to 26 (``tests/radiance/draft/test_patch_graphs.py`` computes them with vLLM's own code); stock,
one query length only, replays a full graph at every B. A batch that shrinks as its requests finish walks
through those sizes, and a piecewise step of the 27B target costs ~1.5x a full one.

So after vLLM builds its table, each token count also gets, per query length its own graphs lack, the
smallest full graph of that length that holds it: the graph stock's dispatch would take for a step of
that length. Nothing vLLM already replays as a full graph changes (the additions come after vLLM's own
full candidates and before its piecewise ones), no graph is captured that vLLM would not capture, and the
padding is what vLLM does for every step between two capture sizes. Every rank builds the same table
from the same config, so the ranks replay the same graph. If widening raises, vLLM's own table stands and
one line says so: slower steps, never a wrong one.
"""
from __future__ import annotations

import logging
from bisect import bisect_left

from ..patching import Hooks
from .patch_runner import VIA

logger = logging.getLogger("radiance")

MANAGER = "vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager"


def widen(candidates: dict, full_descs: list) -> int:
    """Add, in place, to each token count's candidates the smallest full uniform-decode graph of every query
    length its full candidates lack; returns how many entries were added. ``candidates``: vLLM's
    ``(num_tokens, num_active_loras) -> [descriptor, ...]`` in dispatch order; ``full_descs``: the full
    graphs captured."""
    full_set = set(full_descs)
    by_shape: dict[tuple, list] = {}   # (query length, loras, microbatches) -> its graphs by size
    for d in sorted(full_descs, key=lambda d: d.num_tokens):
        if d.uniform_token_count:
            by_shape.setdefault((d.uniform_token_count, d.num_active_loras, d.num_ubatches), []).append(d)
    added = 0
    for (num_tokens, loras), descs in candidates.items():
        full_at = [i for i, d in enumerate(descs) if d in full_set]
        have = {(descs[i].uniform_token_count, descs[i].num_ubatches) for i in full_at}
        extra = []
        for (count, shape_loras, ubatches), graphs in by_shape.items():
            if shape_loras != loras or (count, ubatches) in have:
                continue
            i = bisect_left(graphs, num_tokens, key=lambda d: d.num_tokens)
            if i < len(graphs):
                extra.append(graphs[i])
        if extra:
            at = full_at[-1] + 1 if full_at else 0
            descs[at:at] = sorted(extra, key=lambda d: (d.num_tokens, d.uniform_token_count))
            added += len(extra)
    return added


def full_graphs(manager) -> list:
    from vllm.config.compilation import CUDAGraphMode

    return list(manager._capture_descs.get(CUDAGraphMode.FULL, []))


class GraphTable:
    """What the hook did in this process: candidates added, and why it stopped if it did."""

    def __init__(self) -> None:
        self.added = 0
        self.declined = ""

    def widen_manager(self, manager) -> None:
        if self.declined:
            return
        try:
            full = full_graphs(manager)
            if len({d.uniform_token_count for d in full if d.uniform_token_count}) > 1:   # a schedule's depths
                table = {key: list(descs) for key, descs in manager._candidates.items()}
                added = widen(table, full)   # on a copy: vLLM's table stays whole if this raises
                manager._candidates = table
                self.added += added
                logger.info("radiance: dynamic-draft gave %d entries of %s's CUDA-graph table a full graph of a "
                            "depth they lacked", added, type(manager).__name__)
        except Exception as exc:
            self.declined = f"{type(exc).__name__}: {exc}"
            logger.warning("radiance: dynamic-draft left vLLM's CUDA-graph table as it is (steps between two "
                           "capture sizes may run piecewise): %s", self.declined)


class GraphHooks(Hooks):
    """``CudaGraphManager`` (V2's, and the MTP speculator's, which inherits its table)."""

    target = MANAGER
    via = VIA

    def _init_candidates(self, *args, **kwargs):
        out = self._orig__init_candidates(*args, **kwargs)
        self._radiance_draft.graphs.widen_manager(self)
        return out
