"""The fp8 facts the kernels quantise with (vLLM's own where vLLM runs, the same facts in plain
torch where it does not: kernels never import vLLM themselves), and the shared reproducible exp."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from radiance.kernels import dispatch
from radiance.kernels import fp8_common as fc


def test_where_vllm_runs_its_fp8_format_and_bound_are_the_kernels():
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization.utils.quant_utils import get_fp8_min_max
    from vllm.platforms import current_platform

    dtype, bound = current_platform.fp8_dtype(), get_fp8_min_max()[1]
    assert dispatch.vllm_fp8() == (dtype, bound)
    assert dispatch.fp8_dtype_for_device() == dtype
    # the plain-torch table the kernels fall back to says the same on this platform
    assert fc.fp8_max(dtype) == fc.FP8_MAX[dtype] == bound
    assert fc.min_scale(dtype) == 1.0 / (bound * 512.0)


def test_kernels_alone_do_not_import_vllm():
    code = ("import sys\n"
            "from radiance.kernels import add_rms_quant, allreduce_add_rms_quant, fp8_common, gdn_norm_quant, "
            "quant_fp8\n"
            "import torch\n"
            "assert fp8_common.fp8_max(torch.float8_e4m3fnuz) == 224.0\n"
            "assert fp8_common.resolve_fp8_dtype(None, torch.device('cpu')) == torch.float8_e4m3fn\n"
            "print('vllm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_a_described_target_keeps_its_own_format():
    """The AOT list plans launches for a target that is not here: its format, not this platform's."""
    from radiance.kernels import aot

    with dispatch.describing(aot.DEVICES["gfx942"]):
        assert dispatch.fp8_dtype_for_device(torch.device("cuda", 0)) == torch.float8_e4m3fnuz


def test_exp_reference_accuracy():
    t = torch.linspace(-80.0, 88.0, 200_001, dtype=torch.float32)
    got = fc.exp_reference(t).double()
    want = torch.exp(t.double())
    assert ((got - want).abs() / want).max().item() < 2 * 2.0 ** -23  # within 2 ulp


def test_exp_reference_clamps_instead_of_overflowing():
    got = fc.exp_reference(torch.tensor([-1000.0, 1000.0]))
    assert torch.isfinite(got).all() and got[0] > 0
