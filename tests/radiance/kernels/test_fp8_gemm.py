"""fp8_gemm / scaled_mm: reference vs a float64 dequantise-then-matmul, Triton vs the
reference (interpreter on CPU, compiled on a GPU), torch._scaled_mm vs the reference on a
GPU that has it, the dispatcher, the op's registration, and AOT builds."""
from __future__ import annotations

import textwrap

import pytest
import torch

from radiance.kernels import fp8_gemm as fg

FORMATS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
LAYOUTS = [("tensor", "tensor"), ("token", "channel"), ("token", "tensor"),
           ("group", "block"), ("group", "channel"), ("token", "block")]
# (out dtype, atol, rtol) against float64: fp32 accumulation noise, or one bf16 rounding.
DTYPE_TOL = [(torch.float32, 1e-4, 1e-5), (torch.bfloat16, 1e-2, 2.0 ** -7)]



def make_problem(m, n, k, a_layout, w_layout, fmt=torch.float8_e4m3fn, seed=0):
    g = torch.Generator().manual_seed(seed * 7919 + m * 131 + n * 17 + k)
    a = (torch.randn(m, k, generator=g) * 3).to(fmt)
    w = (torch.randn(n, k, generator=g) * 2).to(fmt)
    sa = {"tensor": lambda: torch.rand(1, generator=g) + 0.5,
          "token": lambda: torch.rand(m, 1, generator=g) + 0.5,
          "group": lambda: torch.rand(m, k // 128, generator=g) + 0.5}[a_layout]()
    sw = {"tensor": lambda: torch.rand(1, generator=g) + 0.5,
          "channel": lambda: torch.rand(n, generator=g) + 0.5,
          "block": lambda: torch.rand(-(-n // 128), k // 128, generator=g) + 0.5}[w_layout]()
    return a, sa * 1e-2, w, sw * 1e-2


def dequant_f64(a, sa, w, sw):
    m, k = a.shape
    n = w.shape[0]
    sa64 = sa.double().reshape(-1, 1) if sa.numel() == 1 or sa.shape == (m, 1) else \
        sa.double().repeat_interleave(128, 1)
    if sw.dim() == 2 and sw.shape[1] == k // 128 and sw.shape != (n, 1):
        sw64 = sw.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    else:
        sw64 = sw.double().reshape(-1, 1)
    return (a.double() * sa64) @ (w.double() * sw64).t()


@pytest.mark.parametrize("out_dtype,atol,rtol", DTYPE_TOL)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("a_layout,w_layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(1, 256, 2048), (8, 384, 5120), (64, 200, 256)])
def test_reference_matches_float64(m, n, k, a_layout, w_layout, fmt, out_dtype, atol, rtol):
    a, sa, w, sw = make_problem(m, n, k, a_layout, w_layout, fmt)
    got = fg.fp8_gemm_reference(a, sa, w, sw, out_dtype)
    assert got.dtype == out_dtype and got.shape == (m, n)
    want = dequant_f64(a, sa, w, sw)
    torch.testing.assert_close(got.double(), want, atol=atol * want.abs().max().item(), rtol=rtol)


def test_bias_and_layout_errors():
    a, sa, w, sw = make_problem(4, 128, 256, "token", "channel")
    bias = torch.randn(128)
    got = fg.fp8_gemm_reference(a, sa, w, sw, torch.float32, bias)
    torch.testing.assert_close(got, fg.fp8_gemm_reference(a, sa, w, sw, torch.float32) + bias)
    with pytest.raises(ValueError, match="a_scale"):
        fg.fp8_gemm_reference(a, torch.ones(3, 1), w, sw)
    with pytest.raises(ValueError, match="w_scale"):
        fg.fp8_gemm_reference(a, sa, w, torch.ones(5, 5))
    with pytest.raises(ValueError, match="backend"):
        fg.scaled_mm(a, sa, w, sw, backend="cublas")


@pytest.mark.parametrize("a_layout,w_layout", LAYOUTS)
def test_op_on_cpu_is_the_reference(a_layout, w_layout):
    a, sa, w, sw = make_problem(8, 256, 512, a_layout, w_layout)
    assert torch.equal(fg.scaled_mm(a, sa, w, sw), fg.fp8_gemm_reference(a, sa, w, sw))
    assert not fg.scaled_mm_supported(a, sa, w, sw, torch.bfloat16)  # CPU tensors


@pytest.mark.parametrize("a_layout,w_layout", [("token", "channel"), ("group", "block")])
def test_opcheck(a_layout, w_layout):
    a, sa, w, sw = make_problem(4, 128, 256, a_layout, w_layout)
    # test_schema perturbs the inputs with arithmetic that fp8 tensors do not implement on
    # CPU; the other checks (fake tensor, autograd registration, AOT dispatch) all run.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    op = torch.ops.radiance.fp8_gemm.default
    torch.library.opcheck(op, (a, sa, w, sw, torch.bfloat16, None), test_utils=utils)
    torch.library.opcheck(op, (a, sa, w, sw, torch.float32, torch.randn(128)), test_utils=utils)


_INTERPRET = textwrap.dedent("""
    import torch
    from radiance.kernels import fp8_gemm as fg
    from test_fp8_gemm import LAYOUTS, make_problem
    worst = 0.0
    for m, n, k in ((1, 96, 256), (20, 200, 384)):
        for al, wl in LAYOUTS:
            for fmt in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
                a, sa, w, sw = make_problem(m, n, k, al, wl, fmt)
                bias = torch.randn(n)
                got = fg.fp8_gemm_triton(a, sa, w, sw, torch.float32, bias)
                want = fg.fp8_gemm_reference(a, sa, w, sw, torch.float32, bias)
                worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    print("WORST", worst)
""")


def test_triton_interpreter_matches_reference(run_interpreted):
    pytest.importorskip("triton")
    out = run_interpreted(_INTERPRET)
    worst = float(out.split("WORST")[-1])
    assert worst < 1e-5, out


# --- GPU ---------------------------------------------------------------------------------

HOPPER_FP8_TOL = 2.0 ** -11
GPU_SHAPES = [(m, n, k) for m in (1, 8, 64, 512) for (n, k) in ((2048, 5120), (5120, 2048))]


@pytest.mark.gpu
@pytest.mark.parametrize("a_layout,w_layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_triton_on_gpu(m, n, k, a_layout, w_layout):
    a, sa, w, sw = make_problem(m, n, k, a_layout, w_layout)
    want = fg.fp8_gemm_reference(a, sa, w, sw, torch.float32)
    got = fg.fp8_gemm_triton(a.cuda(), sa.cuda(), w.cuda(), sw.cuda(), torch.float32).cpu()
    # Hopper's fp8 wgmma (M > 16 tiles) adds products with ~14 mantissa bits before they
    # reach the fp32 accumulator (measured: 1.7e-4 of the largest output); mma on smaller
    # tiles and other archs is tighter.
    tol = HOPPER_FP8_TOL if torch.cuda.get_device_capability() == (9, 0) else 1e-5
    torch.testing.assert_close(got, want, atol=tol * want.abs().max().item(), rtol=tol)
    got16 = fg.fp8_gemm_triton(a.cuda(), sa.cuda(), w.cuda(), sw.cuda()).cpu()
    torch.testing.assert_close(got16, want.to(torch.bfloat16), atol=1e-2, rtol=2.0 ** -7)


@pytest.mark.gpu
@pytest.mark.parametrize("a_layout,w_layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_dispatcher_on_gpu(m, n, k, a_layout, w_layout):
    a, sa, w, sw = [t.cuda() for t in make_problem(m, n, k, a_layout, w_layout)]
    want = fg.fp8_gemm_reference(a.cpu(), sa.cpu(), w.cpu(), sw.cpu()).float()
    got = fg.scaled_mm(a, sa, w, sw).cpu().float()
    torch.testing.assert_close(got, want, atol=1e-2 * want.abs().max().item(), rtol=2.0 ** -6)
    if fg.scaled_mm_supported(a, sa, w, sw, torch.bfloat16):
        direct = fg.scaled_mm(a, sa, w, sw, backend="scaled_mm").cpu().float()
        torch.testing.assert_close(direct, want, atol=1e-2 * want.abs().max().item(), rtol=2.0 ** -6)


@pytest.mark.gpu
def test_scaled_mm_used_where_the_arch_has_it():
    a, sa, w, sw = [t.cuda() for t in make_problem(8, 2048, 2048, "token", "channel")]
    cap = torch.cuda.get_device_capability()
    if not torch.version.hip and cap >= (9, 0):
        assert fg.scaled_mm_supported(a, sa, w, sw, torch.bfloat16)
    g = [t.cuda() for t in make_problem(8, 2048, 2048, "group", "block")]
    assert not fg.scaled_mm_supported(*g, torch.bfloat16)


def test_aot_compiles(aot_arch, aot_specs, aot_compile):
    specs = aot_specs("fp8_gemm", aot_arch)
    # both radiance_fp8 modes run the kernel on the HIP targets; per mode 3 tiles, each for
    # M % 16 == 0 and other M, and M = 1 (a constant to the JIT) in the smallest
    assert len(specs) == 2 * (3 + 2 + 2)
    assert all(s.args[0].dtype == (torch.float8_e4m3fnuz if aot_arch == "gfx942" else torch.float8_e4m3fn)
               for s in specs)
    for spec in [s for s in specs if "M=1" not in s.name and "M%16" not in s.name]:  # one per tile
        compiled = aot_compile(spec, aot_arch)
        if aot_arch == "gfx1201":  # RDNA4's fp8 WMMA, not an upcast
            assert "v_wmma_f32_16x16x16_fp8_fp8" in compiled.asm["amdgcn"], spec.name
