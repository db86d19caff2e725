"""quant_fp8: the op is quantize_reference on CPU, the reference matches vLLM's QuantFP8 on
CPU, Triton equals the reference bit for bit (interpreter on CPU, compiled on a GPU; strided
rows, edge rows, every activation dtype), the op's registration, and AOT builds for gfx1201 /
gfx942."""
from __future__ import annotations

import textwrap

import pytest
import torch

from radiance.kernels import fp8_common as fc
from radiance.kernels import quant_fp8 as qf
from radiance.kernels import shipped

M_SIZES = (1, 8, 64, 512, 4096)
K_SIZES = (2048, 5120)
FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
GROUPS = (0, 128)



def make_inputs(m, k, dtype=torch.bfloat16, device="cpu", seed=0, edge=False):
    g = torch.Generator().manual_seed(seed * 1000003 + m * 31 + k)
    x = torch.randn(m, k, generator=g) * 3.0
    # rows that span the format: tiny, huge, and one scaled down so the min scale clamps
    x[0, :6] = torch.tensor([1e-30, -1e-30, 65504.0, -65504.0, 0.0, 1e-3])
    if edge and m > 2:
        x[1] = 0.0                      # all zero: min scale, every code 0
        x[2] *= 1e-6                    # amax / FMAX under the min scale
    return x.to(dtype).to(device)


def same(a, b) -> bool:
    return torch.equal(a[0].view(torch.uint8).cpu(), b[0].view(torch.uint8).cpu()) and \
        torch.equal(a[1].cpu(), b[1].cpu())


def stock_quant(x, group, fmax):
    """vLLM 0.32.0 QuantFP8.forward_native, written out (per token or per group)."""
    m, k = x.shape
    xg = x.float().view(m, k // group if group else 1, group or k)
    scale = (xg.abs().amax(dim=-1, keepdim=True) / fmax).clamp(min=1.0 / (fmax * 512.0))
    return (xg * scale.reciprocal()).clamp(-fmax, fmax), scale.view(m, -1)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_op_on_cpu_is_the_reference(fmt, group):
    x = make_inputs(8, 2048, edge=True)
    assert same(qf.quant_fp8(x, group, fmt), fc.quantize_reference(x, group, fmt))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_close_to_stock(fmt, group):
    # The reference rounds 1 / scale once (vLLM's reciprocal can be an ulp off): the scales are
    # identical and the codes' inputs agree to fp32 rounding.
    x = make_inputs(64, 2048, edge=True)
    q, scale = fc.quantize_reference(x, group, fmt)
    want_v, want_scale = stock_quant(x, group, fc.FP8_MAX[fmt])
    torch.testing.assert_close(scale, want_scale, rtol=0, atol=0)
    codes = q.float().view_as(want_v)
    torch.testing.assert_close(codes, want_v.to(fmt).float(), rtol=2.0 ** -3, atol=2.0 ** -9)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple"):
        qf.quant_fp8(torch.zeros(2, 400, dtype=torch.bfloat16), 128)
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        qf.quant_fp8(torch.zeros(2, 3, 256, dtype=torch.bfloat16))


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt, group):
    torch.library.opcheck(torch.ops.radiance.quant_fp8.default, (make_inputs(4, 256), group, fmt))


_INTERPRET = textwrap.dedent("""
    import torch
    from fp8_interpreted import check_fp8_cases
    from radiance.kernels import fp8_common as fc
    from radiance.kernels import quant_fp8 as qf
    from test_quant_fp8 import make_inputs

    def pair(case, fmt, group):
        m, k, rows = case
        if rows == "strided":
            x = make_inputs(m, k + 256)[:, 128:128 + k]
        else:
            x = make_inputs(m, k, getattr(torch, rows), edge=True)
        return qf.quant_fp8_triton(x, group, fmt), fc.quantize_reference(x, group, fmt)

    check_fp8_cases([(m, k, rows) for m, k in ((1, 2048), (8, 5120), (3, 384), (4, 256))
                     for rows in ("bfloat16", "float16", "float32", "strided")], pair)
""")


def test_triton_interpreter_bit_exact(interpreter_ok):
    interpreter_ok(_INTERPRET)


@pytest.mark.gpu
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("m", M_SIZES)
def test_triton_bit_exact_on_gpu(m, k, fmt, group):
    x = make_inputs(m, k, edge=True)
    want = fc.quantize_reference(x, group, fmt)  # on the CPU
    assert same(qf.quant_fp8_triton(x.cuda(), group, fmt), want)
    assert same(qf.quant_fp8(x.cuda(), group, fmt), want)  # the op


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.float32))
def test_triton_other_dtypes_and_strides_on_gpu(dtype):
    fmt = torch.float8_e4m3fn
    for group in GROUPS:
        x = make_inputs(64, 2048, dtype, edge=True)
        assert same(qf.quant_fp8_triton(x.cuda(), group, fmt), fc.quantize_reference(x, group, fmt))
        wide = make_inputs(64, 2048 + 256, dtype)[:, 128:128 + 2048]
        assert same(qf.quant_fp8_triton(wide.cuda(), group, fmt),
                    fc.quantize_reference(wide, group, fmt))


def test_aot_compiles(aot_arch, aot_specs, aot_compile):
    specs = aot_specs("quant_fp8", aot_arch)
    # per token one variant per width; per group one for all (K is a plain argument there)
    assert len(specs) == len(shipped.QUANT_FP8_K) + 1
    for spec in specs:
        assert spec.constexprs["FNUZ"] == (aot_arch == "gfx942")
        aot_compile(spec, aot_arch)
