"""allreduce_add_rms_quant as an op: on CPU tensors it is the reference (NCCL's rank-order bf16 sum, then
add_rms_quant's reference), its registration passes opcheck, and it traces under torch.compile. The
kernel against the reference (interpreter, two GPUs) and its AOT builds: tests/radiance/multigpu/test_tp2.py."""
from __future__ import annotations

import pytest
import torch

from radiance.kernels import add_rms_quant as arq
from radiance.kernels import allreduce_add_rms_quant as far

FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
GROUPS = (0, 128)
EPS = 1e-6


def make_inputs(m, k, seed=0):
    g = torch.Generator().manual_seed(seed * 1000003 + m * 31 + k)
    p0, p1, residual = (torch.randn(m, k, generator=g).to(torch.bfloat16) for _ in range(3))
    return p0, p1, residual, torch.randn(k, generator=g).to(torch.bfloat16)


def same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                           y.view(torch.uint8) if y.element_size() == 1 else y) for x, y in zip(a, b))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_op_on_cpu_is_the_reference(fmt, group):
    p0, p1, r, w = make_inputs(5, 512)
    got = far.allreduce_add_rms_quant(p0, p1, r, w, EPS, group, fmt)
    assert same(got, far.allreduce_add_rms_quant_reference([p0, p1], r, w, EPS, group, fmt))
    # the sum is one bf16 rounding in rank order, then the single-rank epilogue
    assert same(got, arq.add_rms_quant_reference((p0.float() + p1.float()).bfloat16(), r, w, EPS, group, fmt))


def test_reference_wants_two_partials():
    p0, _, r, w = make_inputs(2, 256)
    with pytest.raises(ValueError, match="two partial sums"):
        far.allreduce_add_rms_quant_reference([p0], r, w, EPS)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt, group):
    torch.library.opcheck(torch.ops.radiance.allreduce_add_rms_quant.default, (*make_inputs(4, 256), EPS, group, fmt))


def test_traces_under_compile():
    p0, p1, r, w = make_inputs(3, 256)
    fn = torch.compile(lambda a, b: far.allreduce_add_rms_quant(a, b, r, w, EPS, 0, torch.float8_e4m3fn),
                       backend="aot_eager", fullgraph=True)
    assert same(fn(p0, p1), far.allreduce_add_rms_quant_reference([p0, p1], r, w, EPS, 0, torch.float8_e4m3fn))
