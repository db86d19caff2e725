"""gdn_norm_quant: reference vs vLLM's own RMSNormGated + the out_proj's quantiser on CPU
(the mismatch rate is measured and printed, bounded, not asserted zero), the reference's
determinism, Triton vs reference bit for bit (interpreter on CPU, compiled on a GPU), the
op's registration, and AOT builds for gfx1201 / gfx942."""
from __future__ import annotations

import textwrap

import pytest
import torch

from radiance.kernels import fp8_common as fc
from radiance.kernels import gdn_norm_quant as gnq

# (tokens, heads, head dim): Qwen3-Next-80B's value heads per rank at TP=2 / TP=1, the tiny
# test model's (4 x 64, 2 x 64 per rank at TP=2).
M_SIZES = (1, 8, 64, 512, 4096)
HEADS = ((16, 128), (32, 128), (4, 64))
FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
GROUPS = (0, 128)
EPS = 1e-6
# (activation dtype, atol, rtol) of the normed activation against vLLM's: the variance sum,
# rsqrt and exp may differ in the last fp32 bit, moving a value by one bf16 ulp (2^-8).
DTYPE_TOL = [(torch.bfloat16, 1e-6, 2.0 ** -7)]



def make_inputs(m, h, d, dtype=torch.bfloat16, device="cpu", seed=0, strided_z=True):
    """core_attn_out-like x, a gate z (a row-strided view when strided_z, as the GDN slices it
    out of in_proj_qkvz's output) and a norm weight around 1."""
    g = torch.Generator().manual_seed(seed * 1000003 + m * 31 + h * 7 + d)
    x = torch.randn(m, h * d, generator=g) * 0.5
    zz = torch.randn(m, 2 * h * d, generator=g) * 3.0
    w = 1.0 + 0.2 * torch.randn(d, generator=g)
    x[0, :d] = 0.0  # an all-zero head
    zz[0, h * d:h * d + 8] = torch.tensor([-100.0, -88.5, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0])
    x, zz, w = x.to(dtype).to(device), zz.to(dtype).to(device), w.to(dtype).to(device)
    z = zz[:, h * d:] if strided_z else zz[:, h * d:].contiguous()
    return x, z, w


def stock_norm(x, z, w, eps):
    """vLLM 0.32.0 RMSNormGated.forward_static (group_size None, norm_before_gate, silu), per
    head, written out."""
    m, k = x.shape
    d = w.numel()
    xf = x.float().view(m, -1, d)
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    out = xf * torch.rsqrt(var + eps) * w.float()
    out = out * torch.nn.functional.silu(z.float().reshape(m, -1, d))
    return out.to(x.dtype).view(m, k)


def as_bytes(q):
    return q.view(torch.uint8)


# --- reference vs stock (CPU) --------------------------------------------------------------

@pytest.mark.parametrize("dtype,atol,rtol", DTYPE_TOL)
@pytest.mark.parametrize("h,d", HEADS)
@pytest.mark.parametrize("m", M_SIZES)
def test_norm_matches_stock_formula(m, h, d, dtype, atol, rtol):
    x, z, w = make_inputs(m, h, d, dtype)
    torch.testing.assert_close(gnq.gdn_norm_reference(x, z, w, EPS), stock_norm(x, z, w, EPS),
                               atol=atol, rtol=rtol)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h,d", HEADS)
@pytest.mark.parametrize("m", M_SIZES)
def test_quant_matches_stock_formula(m, h, d, fmt, group):
    x, z, w = make_inputs(m, h, d)
    k = h * d
    q, scale = gnq.gdn_norm_quant_reference(x, z, w, EPS, group, fmt)
    assert q.dtype == fmt and q.shape == (m, k)
    assert scale.dtype == torch.float32 and scale.shape == ((m, k // group) if group else (m, 1))
    want = stock_norm(x, z, w, EPS).float().view(m, -1, group or k)
    want_scale = (want.abs().amax(-1) / fc.fp8_max(fmt)).clamp(min=fc.min_scale(fmt))
    torch.testing.assert_close(scale, want_scale, atol=0, rtol=2.0 ** -7)
    deq = q.float().view(m, -1, group or k) * scale.unsqueeze(-1)
    sub = 2.0 ** (-10 if fmt == torch.float8_e4m3fnuz else -9)
    atol = (scale.unsqueeze(-1) * sub).expand_as(deq)
    assert bool(((deq - want).abs() <= want.abs() * (2.0 ** -4 + 2.0 ** -7) + atol).all())


def _vllm_norm(d, w):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNormGated

    with set_current_vllm_config(VllmConfig()):
        norm = RMSNormGated(d, eps=EPS, group_size=None, norm_before_gate=True, activation="silu",
                            dtype=torch.bfloat16)
    norm.weight.data.copy_(w)
    return norm


@pytest.mark.parametrize("h,d", HEADS)
def test_mismatch_rate_against_vllm_rmsnormgated(h, d, capsys):
    """vLLM's own module (CustomOp on CPU: forward_native) then the out_proj's quantiser,
    against ours: the rates are printed (the report quotes them) and bounded. Per call the
    module and forward_native must agree (what the e2e CPU server runs)."""
    pytest.importorskip("vllm")
    m = 4096
    x, z, w = make_inputs(m, h, d, seed=1)
    norm = _vllm_norm(d, w)
    with torch.no_grad():
        stock = norm(x.view(m, h, d), z.reshape(m, h, d)).reshape(m, -1)
        assert torch.equal(stock, norm.forward_native(x.view(m, h, d), z.reshape(m, h, d)).reshape(m, -1))
    ours = gnq.gdn_norm_reference(x, z, w, EPS)
    diff = stock.view(torch.int16) != ours.view(torch.int16)
    ulps = (stock.view(torch.int16).int() - ours.view(torch.int16).int()).abs()
    assert int(ulps.max()) <= 1
    rows_bf16 = diff.any(-1).float().mean().item()
    line = [(f"gdn_norm_quant vs vLLM RMSNormGated, {m} x {h} x {d}: bf16 values differ "
             f"{int(diff.sum())}/{diff.numel()} ({diff.float().mean().item():.2e}), rows {rows_bf16:.4f}")]
    for group in GROUPS:
        qs, ss = fc.quantize_reference(stock, group, torch.float8_e4m3fn)
        qo, so = gnq.gdn_norm_quant_reference(x, z, w, EPS, group, torch.float8_e4m3fn)
        codes = as_bytes(qs) != as_bytes(qo)
        line.append(f"g{group}: codes {int(codes.sum())}/{codes.numel()}, scales "
                    f"{int((ss != so).sum())}/{ss.numel()}, rows {codes.any(-1).float().mean().item():.4f}")
        assert codes.float().mean().item() < 1e-4
    with capsys.disabled():
        print("\n" + "; ".join(line))
    assert diff.float().mean().item() < 1e-4


# --- reference determinism ---------------------------------------------------------------

@pytest.mark.parametrize("group", GROUPS)
def test_reference_deterministic_and_batch_invariant(group):
    x, z, w = make_inputs(64, 16, 128)
    a = gnq.gdn_norm_quant_reference(x, z, w, EPS, group, torch.float8_e4m3fn)
    b = gnq.gdn_norm_quant_reference(x.clone(), z.contiguous(), w.clone(), EPS, group, torch.float8_e4m3fn)
    assert torch.equal(as_bytes(a[0]), as_bytes(b[0])) and torch.equal(a[1], b[1])
    for i in (0, 17, 63):
        one = gnq.gdn_norm_quant_reference(x[i:i + 1], z[i:i + 1], w, EPS, group, torch.float8_e4m3fn)
        assert torch.equal(as_bytes(one[0]), as_bytes(a[0][i:i + 1])) and torch.equal(one[1], a[1][i:i + 1])


def test_silu_reference_accuracy():
    t = torch.linspace(-80.0, 80.0, 100_001, dtype=torch.float32)
    want = t.double() / (1.0 + torch.exp(-t.double()))
    got = gnq.silu_reference(t).double()
    assert bool(((got - want).abs() <= want.abs() * 3 * 2.0 ** -24 + 1e-38).all())


def test_rejects_bad_arguments():
    x, z, w = make_inputs(2, 4, 64)
    with pytest.raises(ValueError, match="both be"):
        gnq.gdn_norm_quant_reference(x, z[:, :128], w, EPS)
    with pytest.raises(ValueError, match="weight must be"):
        gnq.gdn_norm_quant_reference(x, z, w[:48], EPS)
    with pytest.raises(ValueError, match="multiple"):
        gnq.gdn_norm_quant_reference(x[:, :192], z[:, :192], w, EPS, 128)
    with pytest.raises(ValueError, match="group_size"):
        gnq.gdn_norm_quant_reference(x, z, w, EPS, 64)


# --- the op --------------------------------------------------------------------------------

@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_op_on_cpu_is_the_reference(fmt, group):
    x, z, w = make_inputs(8, 16, 128)
    got = gnq.gdn_norm_quant(x, z, w, EPS, group, fmt)
    want = gnq.gdn_norm_quant_reference(x, z, w, EPS, group, fmt)
    assert torch.equal(as_bytes(got[0]), as_bytes(want[0])) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt, group):
    x, z, w = make_inputs(4, 4, 64, strided_z=False)
    torch.library.opcheck(torch.ops.radiance.gdn_norm_quant.default, (x, z, w, EPS, group, fmt))


def test_default_format_follows_device():
    x, z, w = make_inputs(2, 4, 64)
    assert gnq.gdn_norm_quant(x, z, w, EPS)[0].dtype == torch.float8_e4m3fn


# --- Triton vs reference: interpreter on CPU ---------------------------------------------

_INTERPRET = textwrap.dedent("""
    from fp8_interpreted import check_fp8_cases
    from radiance.kernels import gdn_norm_quant as gnq
    from test_gdn_norm_quant import make_inputs

    def pair(case, fmt, group):
        m, h, d, strided = case
        if group and (h * d) % group:
            return None
        x, z, w = make_inputs(m, h, d, strided_z=strided)
        return (gnq.gdn_norm_quant_triton(x, z, w, 1e-6, group, fmt),
                gnq.gdn_norm_quant_reference(x, z, w, 1e-6, group, fmt))

    check_fp8_cases(((1, 16, 128, True), (8, 4, 64, True), (3, 3, 128, False), (5, 2, 64, True)), pair)
""")


def test_triton_interpreter_bit_exact(interpreter_ok):
    interpreter_ok(_INTERPRET)


# --- Triton vs reference on a GPU ----------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h,d", HEADS)
@pytest.mark.parametrize("m", M_SIZES)
def test_triton_bit_exact_on_gpu(m, h, d, fmt, group):
    x, z, w = make_inputs(m, h, d)
    want = gnq.gdn_norm_quant_reference(x, z, w, EPS, group, fmt)  # on the CPU
    xc, zc, wc = x.cuda(), z.cuda(), w.cuda()
    for got in (gnq.gdn_norm_quant_triton(xc, zc, wc, EPS, group, fmt),
                gnq.gdn_norm_quant_triton(xc, zc.contiguous(), wc, EPS, group, fmt),
                gnq.gdn_norm_quant(xc, zc, wc, EPS, group, fmt)):
        assert torch.equal(as_bytes(got[0]).cpu(), as_bytes(want[0]))
        assert torch.equal(got[1].cpu(), want[1])


@pytest.mark.gpu
def test_reference_on_gpu_equals_reference_on_cpu():
    x, z, w = make_inputs(64, 16, 128)
    a = gnq.gdn_norm_quant_reference(x, z, w, EPS, 0, torch.float8_e4m3fn)
    b = gnq.gdn_norm_quant_reference(x.cuda(), z.cuda(), w.cuda(), EPS, 0, torch.float8_e4m3fn)
    assert torch.equal(as_bytes(b[0]).cpu(), as_bytes(a[0])) and torch.equal(b[1].cpu(), a[1])


# --- AOT ---------------------------------------------------------------------------------

def test_aot_compiles(aot_arch, aot_specs, aot_compile):
    specs = aot_specs("gdn_norm_quant", aot_arch)
    assert len(specs) == len(GROUPS)  # Qwen3.5-27B's value heads per rank, the device's fp8 format
    for spec in specs:
        assert not spec.constexprs["NATIVE"] and not spec.constexprs["HW_FP8"]
        assert spec.constexprs["FNUZ"] == (aot_arch == "gfx942")
        aot_compile(spec, aot_arch)


def test_aot_nvidia_specs(aot_specs, aot_compile):
    specs = aot_specs("gdn_norm_quant", "sm90")
    assert len(specs) == len(GROUPS)
    assert all(s.constexprs["NATIVE"] and not s.constexprs["FNUZ"] for s in specs)
    aot_compile(specs[0], "sm90")
