"""TP=2 on two GPUs (NCCL): the fused one-shot all-reduce + add + RMSNorm + fp8 quant equals
all-reduce + the reference epilogue.

The two-GPU test reuses the correctness half of benchmarks/bench_tp2_allreduce_epilogue.py (one
definition of the inputs and of what "equal" means). The fused kernel's arithmetic is also checked on CPU in
the Triton interpreter, with two local tensors standing in for the ranks' partials."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"

two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two GPUs")

def _bench_modules():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import bench_tp2_allreduce_epilogue
    from _tp2_common import launch

    return bench_tp2_allreduce_epilogue, launch


def _epilogue_worker(rank, world, out):
    ar, _ = _bench_modules()
    from radiance.kernels.allreduce_add_rms_quant import TwoRankAllReduceEpilogue

    res = []
    for k in ar.KS:
        fused = TwoRankAllReduceEpilogue(64, k, torch.bfloat16)
        res += [ar.check(rank, world, m, k, fused) for m in (1, 7, 64)]
    out[rank] = res


@pytest.mark.gpu
@two_gpus
def test_fused_allreduce_epilogue_tp2_exact():
    import torch.multiprocessing as mp

    _, launch = _bench_modules()
    out = mp.Manager().dict()
    launch(_epilogue_worker, (out,))
    for rank in (0, 1):
        for c in out[rank]:
            assert c["allreduce_exact"] and c["separate_exact"] and c["fused_exact"], (rank, c)


INTERPRETED = """
import torch
from radiance.kernels.allreduce_add_rms_quant import (allreduce_add_rms_quant_reference,
                                                 allreduce_add_rms_quant_triton)
g = torch.Generator().manual_seed(0)
for m, k in [(3, 2048), (2, 5120)]:
    for group in (0, 128):
        for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            p0, p1, r = ((torch.randn(m, k, generator=g) * s).bfloat16() for s in (1, 1e-3, 2))
            p0[0, :5] = torch.tensor([1e4, -1e4, 0.0, 3.0, 1e-30])  # cancellation, tiny addends
            w = (torch.randn(k, generator=g) * 0.1).bfloat16()
            got = allreduce_add_rms_quant_triton(p0, p1, r, w, 1e-6, group, fp8)
            want = allreduce_add_rms_quant_reference([p0, p1], r, w, 1e-6, group, fp8)
            assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)), (m, k, group, fp8)
            assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), (m, k, group, fp8)
print("ok")
"""


def test_fused_kernel_interpreted_exact():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]]
                                                        if os.environ.get("PYTHONPATH") else []))}
    out = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


@pytest.mark.parametrize("arch", ["gfx1201", "gfx942"])
def test_fused_allreduce_kernel_builds_ahead_of_time_for_amd(arch):
    pytest.importorskip("triton")
    from radiance.kernels import aot

    import radiance.kernels.allreduce_add_rms_quant  # noqa: F401  (registers its specs)

    specs = [s for s in aot.specs_for(arch) if s.name.startswith("allreduce_add_rms_quant[")]
    assert len(specs) == 2  # hidden 5120, per token and per group of 128, the device's fp8 format
    for spec in specs:
        assert aot.compile_spec(spec, arch).asm.get("hsaco"), spec.name
