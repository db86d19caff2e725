"""A stand-in for the fused two-rank op that returns a wrong sum: what the load-time self-test must catch
(used in-process and in the spawned ranks of the two-process test)."""
from __future__ import annotations


def planted_wrong_sum(real, index: int):
    """``real`` with 1.0 added to element ``index`` of the new residual it returns."""

    def planted(*args):
        q, scale, residual = real(*args)
        residual = residual.clone()
        residual.view(-1)[index] += 1.0
        return q, scale, residual

    return planted
