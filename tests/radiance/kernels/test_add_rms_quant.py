"""add_rms_quant: reference vs an independent (stock vLLM) formula on CPU, the reference's
determinism, Triton vs reference bit for bit (interpreter on CPU, compiled on a GPU), the
op's registration, and AOT builds for gfx1201 / gfx942."""
from __future__ import annotations

import textwrap

import pytest
import torch

from radiance.kernels import add_rms_quant as arq
from radiance.kernels import fp8_common as fc

M_SIZES = (1, 8, 64, 512, 4096)
K_SIZES = (2048, 5120)
FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
GROUPS = (0, 128)
EPS = 1e-6
# (activation dtype, atol, rtol) of the normed activation against the stock formula: the
# rsqrt and the variance's summation order may move it by one bf16 ulp (2^-8 relative).
DTYPE_TOL = [(torch.bfloat16, 1e-5, 2.0 ** -7)]



def make_inputs(m, k, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed * 1000003 + m * 31 + k)
    # Partial sums from a RowParallel linear and a residual stream of growing magnitude,
    # Gemma weights centred on 0 (applied as 1 + w).
    y = (torch.randn(m, k, generator=g) * 2.0).to(dtype)
    r = (torch.randn(m, k, generator=g) * 8.0).to(dtype)
    w = (torch.randn(k, generator=g) * 0.2).to(dtype)
    return y.to(device), r.to(device), w.to(device)


def stock_norm(y, r, w, eps):
    """vLLM 0.32.0 GemmaRMSNorm.forward_native -> ir fused_add_rms_norm, written out."""
    x = y.to(torch.float32) + r.to(torch.float32)
    new_r = x.to(y.dtype)
    var = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(var + eps)
    x = x.to(torch.float32) * (w.float() + 1.0)
    return x.to(y.dtype), new_r


def as_bytes(q):
    return q.view(torch.uint8)


# --- reference vs the independent formula (CPU) -----------------------------------------

@pytest.mark.parametrize("dtype,atol,rtol", DTYPE_TOL)
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("m", M_SIZES)
def test_norm_matches_stock_formula(m, k, dtype, atol, rtol):
    y, r, w = make_inputs(m, k, dtype)
    normed, new_r = arq.add_rms_norm_reference(y, r, w, EPS)
    want, want_r = stock_norm(y, r, w, EPS)
    assert torch.equal(new_r, want_r)  # the residual has one rounding point in both
    torch.testing.assert_close(normed, want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("m", M_SIZES)
def test_quant_matches_stock_formula(m, k, fmt, group):
    y, r, w = make_inputs(m, k)
    q, scale, new_r = arq.add_rms_quant_reference(y, r, w, EPS, group, fmt)
    want, want_r = stock_norm(y, r, w, EPS)
    assert q.dtype == fmt and q.shape == (m, k)
    assert scale.dtype == torch.float32 and scale.shape == ((m, k // group) if group else (m, 1))
    assert torch.equal(new_r, want_r)
    fmax = fc.fp8_max(fmt)
    groups = want.float().view(m, -1, group or k)
    want_scale = (groups.abs().amax(-1) / fmax).clamp(min=fc.min_scale(fmt))
    torch.testing.assert_close(scale, want_scale, atol=0, rtol=2.0 ** -7)
    # Dequantised codes sit within half an fp8 step (2^-4 relative) of the stock activation,
    # plus one bf16 ulp; near zero within half the smallest subnormal step.
    deq = q.float().view(m, -1, group or k) * scale.unsqueeze(-1)
    sub = 2.0 ** (-10 if fmt == torch.float8_e4m3fnuz else -9)
    atol = (scale.unsqueeze(-1) * sub).expand_as(deq)
    err = (deq - groups).abs()
    assert bool((err <= groups.abs() * (2.0 ** -4 + 2.0 ** -7) + atol).all())
    # Nothing clips: the largest code of each group is the format's max (up to rounding).
    assert deq.abs().amax(-1).sub(groups.abs().amax(-1)).abs().max() <= scale.max() * fmax * 2 ** -4


def test_matches_vllm_native_impl():
    """The same comparison against vLLM's own code, where vLLM is importable."""
    ops = pytest.importorskip("vllm.ir.ops")
    y, r, w = make_inputs(64, 2048)
    native = ops.fused_add_rms_norm.impls["native"].impl_fn
    want, want_r = native(y.clone(), r.clone(), w.float() + 1.0, EPS)
    normed, new_r = arq.add_rms_norm_reference(y, r, w, EPS)
    assert torch.equal(new_r, want_r)
    torch.testing.assert_close(normed, want, atol=1e-5, rtol=2.0 ** -7)


def test_fp32_residual_stays_in_activation_dtype():
    """stock keeps the new residual in x's dtype whatever the residual came in as."""
    y, r, w = make_inputs(8, 2048)
    _, _, new_r = arq.add_rms_quant_reference(y, r.float(), w, EPS)
    assert new_r.dtype == torch.bfloat16
    assert torch.equal(new_r, (y.float() + r.float()).to(torch.bfloat16))


# --- reference determinism ---------------------------------------------------------------

@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("k", K_SIZES)
def test_reference_deterministic_and_batch_invariant(k, group):
    y, r, w = make_inputs(64, k)
    a = arq.add_rms_quant_reference(y, r, w, EPS, group, torch.float8_e4m3fn)
    b = arq.add_rms_quant_reference(y.clone(), r.clone(), w.clone(), EPS, group, torch.float8_e4m3fn)
    for x, z in zip(a, b):
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                           z.view(torch.uint8) if z.dtype == torch.float8_e4m3fn else z)
    # a row's output does not depend on its batch (the kernel runs one program per row)
    for i in (0, 17, 63):
        one = arq.add_rms_quant_reference(y[i:i + 1], r[i:i + 1], w, EPS, group, torch.float8_e4m3fn)
        assert torch.equal(as_bytes(one[0]), as_bytes(a[0][i:i + 1]))
        assert torch.equal(one[1], a[1][i:i + 1])


def test_exact_sumsq_is_order_free_and_accurate():
    g = torch.Generator().manual_seed(1)
    sq = (torch.randn(16, 5120, generator=g) * torch.logspace(-3, 3, 16).unsqueeze(-1)) ** 2
    got = fc.exact_sumsq(sq, fc.sum_log2(5120))
    perm = torch.randperm(5120, generator=g)
    assert torch.equal(got, fc.exact_sumsq(sq[:, perm], fc.sum_log2(5120)))
    want = sq.double().sum(-1)
    assert ((got.double() - want).abs() / want).max() <= 2.0 ** -24  # one rounding, no more
    # zero rows, rows near both ends of the fp32 range, small integers
    edge = torch.tensor([[0.0] * 4, [1e-30, 1e-31, 0.0, 0.0], [3e38, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    got = fc.exact_sumsq(edge, 7)
    assert got[0] == 0 and got[2] == edge[2, 0] and got[3] == 10.0
    assert abs(got[1].item() / 1.1e-30 - 1) < 2 ** -20


def test_reference_divisions_are_correctly_rounded():
    """The reference must not inherit an ulp from MKL's sqrt or a reciprocal-multiply."""
    x = torch.rand(100_000, dtype=torch.float32) * 100 + 1e-3
    want = (1.0 / torch.sqrt(x.double())).float()  # float64 then one rounding
    assert torch.equal(fc.div_rn(torch.ones_like(x), fc.sqrt_rn(x)),
                       fc.div_rn(torch.ones_like(x), torch.sqrt(x.double()).float()))
    assert (fc.div_rn(torch.ones_like(x), fc.sqrt_rn(x)) - want).abs().max() <= want.max() * 2 ** -23


def test_rejects_bad_arguments():
    y, r, w = make_inputs(2, 2048)
    with pytest.raises(ValueError, match="group_size"):
        arq.add_rms_quant_reference(y, r, w, EPS, 64)
    with pytest.raises(ValueError, match="multiple"):
        arq.add_rms_quant_reference(y[:, :200], r[:, :200], w[:200], EPS, 128)
    with pytest.raises(ValueError, match="fp8_dtype"):
        arq.add_rms_quant_reference(y, r, w, EPS, 0, torch.float8_e5m2)


# --- the op ------------------------------------------------------------------------------

@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_op_on_cpu_is_the_reference(fmt, group):
    y, r, w = make_inputs(8, 2048)
    got = arq.add_rms_quant(y, r, w, EPS, group, fmt)
    want = arq.add_rms_quant_reference(y, r, w, EPS, group, fmt)
    assert torch.equal(as_bytes(got[0]), as_bytes(want[0]))
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt, group):
    y, r, w = make_inputs(4, 256)
    torch.library.opcheck(torch.ops.radiance.add_rms_quant.default, (y, r, w, EPS, group, fmt))


def test_default_format_follows_device():
    y, r, w = make_inputs(2, 256)
    q, _, _ = arq.add_rms_quant(y, r, w, EPS)
    assert q.dtype == torch.float8_e4m3fn  # CPU and NVIDIA; gfx94x would get fnuz


# --- Triton vs reference: interpreter on CPU ---------------------------------------------

_INTERPRET = textwrap.dedent("""
    from fp8_interpreted import check_fp8_cases
    from radiance.kernels import add_rms_quant as arq
    from test_add_rms_quant import make_inputs

    def pair(case, fmt, group):
        m, k, edge = case
        y, r, w = make_inputs(m, k)
        if edge:  # rows that take the exact amax reduction instead of the prediction
            y[0] = -r[0]            # an all-zero row
            w[5] = 2.0 ** 21        # |1 + w| beyond the prediction's bound
        return (arq.add_rms_quant_triton(y, r, w, 1e-6, group, fmt),
                arq.add_rms_quant_reference(y, r, w, 1e-6, group, fmt))

    check_fp8_cases(((1, 2048, False), (8, 5120, False), (3, 384, False), (4, 256, True)), pair)
""")


def test_triton_interpreter_bit_exact(interpreter_ok):
    interpreter_ok(_INTERPRET)


# --- Triton vs reference on a GPU (bit for bit, across devices) ---------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("m", M_SIZES)
def test_triton_bit_exact_on_gpu(m, k, fmt, group):
    y, r, w = make_inputs(m, k)
    want = arq.add_rms_quant_reference(y, r, w, EPS, group, fmt)  # on the CPU
    # twice (the second call reuses the cached per-shape plan), then the op, which dispatches
    # to the same kernel
    yc, rc, wc = y.cuda(), r.cuda(), w.cuda()
    for got in (arq.add_rms_quant_triton(yc, rc, wc, EPS, group, fmt),
                arq.add_rms_quant_triton(yc, rc, wc, EPS, group, fmt),
                arq.add_rms_quant(yc, rc, wc, EPS, group, fmt)):
        assert torch.equal(as_bytes(got[0]).cpu(), as_bytes(want[0]))
        assert torch.equal(got[1].cpu(), want[1])
        assert torch.equal(got[2].cpu(), want[2])


@pytest.mark.gpu
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_triton_bit_exact_on_gpu_edge_rows(fmt, group):
    """Rows that take the exact amax reduction (zero row, huge 1 + w), a misaligned input
    (a second, unvectorised specialisation), and rows of very different magnitudes."""
    y, r, w = make_inputs(64, 5120, seed=3)
    y[0] = -r[0]
    w[7] = 2.0 ** 21
    sc = torch.logspace(-15, 15, 8).unsqueeze(-1)  # squares stay normal fp32
    y[1:9] = (y[1:9].float() * sc).to(y.dtype)
    r[1:9] = (r[1:9].float() * sc).to(r.dtype)
    want = arq.add_rms_quant_reference(y, r, w, EPS, group, fmt)
    yc = torch.empty(64 * 5120 + 1, dtype=y.dtype, device="cuda")[1:].view(64, 5120)
    yc.copy_(y)
    for yy in (yc, y.cuda()):
        got = arq.add_rms_quant_triton(yy, r.cuda(), w.cuda(), EPS, group, fmt)
        assert torch.equal(as_bytes(got[0]).cpu(), as_bytes(want[0]))
        assert torch.equal(got[1].cpu(), want[1])
        assert torch.equal(got[2].cpu(), want[2])


@pytest.mark.gpu
def test_reference_on_gpu_equals_reference_on_cpu():
    y, r, w = make_inputs(64, 5120)
    a = arq.add_rms_quant_reference(y, r, w, EPS, 0, torch.float8_e4m3fn)
    b = arq.add_rms_quant_reference(y.cuda(), r.cuda(), w.cuda(), EPS, 0, torch.float8_e4m3fn)
    assert torch.equal(as_bytes(b[0]).cpu(), as_bytes(a[0]))
    assert torch.equal(b[1].cpu(), a[1])


# --- AOT ---------------------------------------------------------------------------------

def test_aot_compiles(aot_arch, aot_specs, aot_compile):
    specs = aot_specs("add_rms_quant", aot_arch)
    assert len(specs) == len(GROUPS)  # the profiles' one hidden size, the device's fp8 format
    for spec in specs:
        assert not spec.constexprs["NATIVE"] and not spec.constexprs["HW_FP8"]  # HIP: integer paths
        assert spec.constexprs["FNUZ"] == (aot_arch == "gfx942")
        aot_compile(spec, aot_arch)


def test_aot_nvidia_specs(aot_specs, aot_compile):
    specs = aot_specs("add_rms_quant", "sm90")
    assert len(specs) == len(GROUPS)
    for spec in specs:
        assert spec.constexprs["NATIVE"] and spec.constexprs["HW_FP8"] and not spec.constexprs["FNUZ"]
    aot_compile(specs[0], "sm90")
