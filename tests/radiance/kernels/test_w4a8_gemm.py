"""w4a8_gemm: the reference against an independent dequantise-and-matmul (float64), the op (CPU
dispatch, opcheck, fake under compile, shape checks), the config table, the Triton kernel in the
interpreter on CPU, AOT builds for gfx1201 (fp8 WMMA) / gfx942 (fnuz), and the compiled kernel
against the reference on a GPU."""
from __future__ import annotations

import json

import pytest
import torch

from radiance.kernels import shipped
from radiance.kernels import w4_layout as layout
from radiance.kernels import w4a8_gemm as w8
from radiance.kernels.fp8_common import quantize_reference
from radiance.kernels.dispatch import DeviceInfo
from radiance.w4 import quant

FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
# Qwen3.5-27B per-rank linears at TP=2 (what radiance_w4 serves) and odd ones (N not a multiple of
# any tile, a 256 group, tiny in_proj_ba-like N).
SHIPPED = sorted({(n, k, shipped.W4A8_GROUP) for n, k in shipped.W4A8.values()})
ODD = [(1000, 384, 128), (77, 5120, 128), (333, 512, 256), (4, 256, 128)]
M_SIZES = (1, 3, 8, 16, 33, 64, 200, 1100)


def make_packed(n, k, g, device="cpu", seed=0):
    """Random words are valid packed weights; scales make every output O(1)."""
    gen = torch.Generator().manual_seed(seed * 7919 + n * 31 + k)
    qshape, sshape = layout.packed_shapes(n, k, g)
    qw = torch.randint(-2**31, 2**31 - 1, qshape, dtype=torch.int32, generator=gen)
    sc = (torch.rand(sshape, generator=gen) + 0.5) / (4.6 * k ** 0.5)
    return qw.to(device), sc.to(torch.bfloat16).to(device)


def make_act(m, k, group=0, fp8=torch.float8_e4m3fn, device="cpu", seed=1):
    """(codes, fp32 scales) as the epilogue quantises a bf16 activation."""
    gen = torch.Generator().manual_seed(seed * 104729 + m * 13 + k)
    x = torch.randn((m, k), generator=gen).to(torch.bfloat16)
    q, s = quantize_reference(x, group, fp8)
    return q.to(device), s.to(device)


def dequant_matmul_f64(a_q, a_scale, qw, sc, k, g):
    q, s = layout.unpack(qw.cpu(), sc.cpu(), k, g)
    w = q.double() * s.double().repeat_interleave(g, dim=1)
    a = a_q.cpu().double()
    sa = a_scale.cpu().double()
    a = a * (sa.repeat_interleave(128, dim=1) if sa.shape[-1] > 1 else sa.reshape(-1, 1) if sa.numel() > 1 else sa.reshape(()))
    return a @ w.t()


def close(got, want, rtol=2.0 ** -7, frac=1e-3):
    """One rounding to bf16 apart (rtol), plus fp32 summation-order noise relative to the largest output
    (Hopper's fp8 wgmma adds products with reduced precision, fp8_gemm measured 1.7e-4)."""
    got, want = got.double().cpu(), want.double().cpu()
    bound = rtol * want.abs() + frac * float(want.abs().max()) + 1e-6
    return bool(((got - want).abs() <= bound).all()), float((got - want).abs().max())


# --- reference ---------------------------------------------------------------------------

@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("a_group", [0, 128, -1])  # -1: one scale for the tensor
@pytest.mark.parametrize("n,k,g", [(64, 256, 128), (40, 512, 256), (7, 384, 128)])
def test_reference_is_dequantise_then_matmul(n, k, g, a_group, fp8):
    qw, sc = make_packed(n, k, g)
    a_q, a_s = make_act(5, k, max(a_group, 0), fp8)
    if a_group < 0:
        a_s = a_s.max().reshape(1, 1)
    got = w8.w4a8_gemm_reference(a_q, a_s, qw, sc, g, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (5, n)
    ok, err = close(got, dequant_matmul_f64(a_q, a_s, qw, sc, k, g), frac=1e-5)
    assert ok, err


def test_quantised_weight_tracks_the_bf16_matmul():
    """The whole W4A8 path (the project's quantiser, the epilogue's fp8 activation) stays within the
    4-bit error of the bf16 product."""
    w = (torch.randn(256, 512) * 0.02).to(torch.bfloat16)
    qw, sc = quant.quantize_pack(w, 128)
    x = torch.randn(8, 512).to(torch.bfloat16)
    a_q, a_s = quantize_reference(x, 0, torch.float8_e4m3fn)
    got = w8.w4a8_gemm(a_q, a_s, qw, sc, 128).float()
    want = x.float() @ w.float().t()
    assert float((got - want).norm() / want.norm()) < 0.15


# --- the op --------------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_op_on_cpu_is_the_reference(out_dtype):
    qw, sc = make_packed(96, 256, 128)
    a_q, a_s = make_act(4, 256)
    got = torch.ops.radiance.w4a8_gemm(a_q, a_s, qw, sc, 128, out_dtype)
    assert got.dtype == out_dtype
    assert torch.equal(got, w8.w4a8_gemm_reference(a_q, a_s, qw, sc, 128, out_dtype))
    assert torch.equal(w8.w4a8_gemm(a_q, a_s, qw, sc, 128, out_dtype), got)


@pytest.mark.parametrize("m", [1, 5])
def test_opcheck(m):
    qw, sc = make_packed(64, 256, 128)
    a_q, a_s = make_act(m, 256)
    # test_schema compares fp8 inputs with arithmetic fp8 does not implement on CPU; the other checks run
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.radiance.w4a8_gemm.default, (a_q, a_s, qw, sc, 128, torch.bfloat16),
                          test_utils=utils)


def test_fake_impl_traces_under_compile():
    qw, sc = make_packed(64, 256, 128)
    fn = torch.compile(lambda a, s: torch.ops.radiance.w4a8_gemm(a, s, qw, sc, 128, torch.bfloat16) * 2,
                       backend="aot_eager", fullgraph=True)
    a_q, a_s = make_act(3, 256)
    assert torch.equal(fn(a_q, a_s), w8.w4a8_gemm_reference(a_q, a_s, qw, sc, 128) * 2)


def test_op_rejects_what_it_cannot_take():
    qw, sc = make_packed(64, 256, 128)
    a_q, a_s = make_act(3, 256)
    with pytest.raises(ValueError, match="fp8"):
        w8.w4a8_gemm(a_q.float(), a_s, qw, sc, 128)
    with pytest.raises(ValueError, match="multiples of 128"):
        w8.w4a8_gemm(a_q, a_s, *make_packed(64, 256, 64), 64)
    with pytest.raises(ValueError, match="a_scale"):
        w8.w4a8_gemm(a_q, torch.ones(2, 1), qw, sc, 128)
    with pytest.raises(ValueError, match="packed shapes"):
        w8.w4a8_gemm(*make_act(3, 384), qw, sc, 128)


# --- configs -------------------------------------------------------------------------------

def test_default_config_follows_the_w4a16_plan():
    cfg = w8.default_config(8, 5120, 8704, 132)
    assert cfg.split_k > 1 and cfg.block_m == 16 and cfg.slabs == 2 and not cfg.mma16
    assert w8.default_config(8, 5120, 8704, 132, "cuda").mma16  # what won on the H200


def test_table_lookup(tmp_path, monkeypatch):
    dev = DeviceInfo("cuda", "sm90", 132, "testdev")
    table = {"configs": [{"n": 512, "k": 1024, "group_size": 128, "m": 8,
                          "config": {"block_n": 32, "block_m": 16, "split_k": 2, "num_warps": 4,
                                     "num_stages": 2, "slabs": 8}}]}
    (tmp_path / "testdev.json").write_text(json.dumps(table))
    monkeypatch.setattr(w8, "CONFIG_DIR", tmp_path)
    w8.clear_caches()
    try:
        assert w8.config_for(5, 512, 1024, 128, dev).slabs == 8      # bucket 8
        # past the tuned M: its config, tiles widened to the rows
        assert w8.config_for(40, 512, 1024, 128, dev) == w8.Config(32, 64, 2, 4, 2, 8)
        assert w8.config_for(9, 256, 1024, 128, dev) == w8.default_config(9, 256, 1024, 132, "cuda")
        (tmp_path / "testdev.json").write_text("{broken")
        w8.clear_caches()
        assert w8.config_for(5, 512, 1024, 128, dev) == w8.default_config(5, 512, 1024, 132, "cuda")
    finally:
        w8.clear_caches()


def test_shipped_tables_parse():
    for path in w8.CONFIG_DIR.glob("*.json"):
        assert w8.load_table(path.stem), path


# --- Triton in the interpreter (CPU) -------------------------------------------------------

_INTERPRET = """
import torch
from test_w4a8_gemm import make_packed, make_act, close
from radiance.kernels import w4a8_gemm as w8
bad = []
cases = [(96, 256, 128, 0, 3, w8.Config(64, 16, 1, 4, 2, 2)),
         (77, 512, 256, 0, 1, w8.Config(32, 16, 2, 4, 2, 4)),
         (40, 384, 128, 128, 17, w8.Config(32, 32, 3, 4, 2, 8)),
         (4, 256, 128, -1, 5, w8.Config(64, 16, 2, 4, 2, 2)),
         (96, 256, 128, 0, 9, w8.Config(64, 16, 2, 4, 2, 2, True)),
         (40, 384, 128, 128, 3, w8.Config(32, 16, 1, 4, 2, 2, True))]
for n, k, g, ag, m, cfg in cases:
    qw, sc = make_packed(n, k, g)
    a_q, a_s = make_act(m, k, max(ag, 0))
    if ag < 0:
        a_s = a_s.max().reshape(1, 1)
    got = w8.w4a8_gemm_triton(a_q, a_s, qw, sc, g, torch.bfloat16, cfg)
    ok, err = close(got, w8.w4a8_gemm_reference(a_q, a_s, qw, sc, g, torch.bfloat16))
    if not ok:
        bad.append((n, k, g, ag, m, err))
print("MISMATCH", bad) if bad else print("OK")
"""


def test_triton_interpreter_matches_reference(run_interpreted):
    pytest.importorskip("triton")
    out = run_interpreted(_INTERPRET, timeout=900)
    assert out.strip().endswith("OK"), out[-3000:]


# --- AOT -----------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gfx1201", "gfx942", "sm90"])
def test_aot_compiles(arch, aot_specs, aot_compile):
    """gfx1201 / gfx942 (no tuned table): the fp8 MMA on the device's fp8 format; sm90: the tuned
    table's 16-bit MMA (bf16 codes from the PTX unpack, the activation upcast before the launch)."""
    specs = aot_specs("w4a8_gemm", arch)
    assert {s.constexprs["BLOCK_M"] for s in specs} >= {16, 32, 64}
    assert not any(s.constexprs["UPCAST"] or s.constexprs["INTERPRET"] for s in specs)
    if arch == "sm90":
        assert all(s.constexprs["MMA16"] and s.constexprs["USE_ASM"] and s.args[0].dtype == torch.bfloat16
                   for s in specs)
    else:
        fp8 = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
        assert all(not s.constexprs["MMA16"] and s.args[0].dtype == fp8 for s in specs)
    compiled = aot_compile(specs[0], arch)
    if arch == "gfx1201":  # RDNA4's fp8 WMMA, not an upcast
        assert "v_wmma_f32_16x16x16_fp8_fp8" in compiled.asm["amdgcn"]
    aot_compile(specs[-1], arch)


# --- Triton vs reference on a GPU ----------------------------------------------------------

_PACKED: dict = {}


def gpu_packed(n, k, g):
    if (n, k, g) not in _PACKED:
        _PACKED.clear()
        _PACKED[(n, k, g)] = make_packed(n, k, g, "cuda")
    return _PACKED[(n, k, g)]


def gpu_fp8():
    from radiance.kernels.dispatch import fp8_dtype_for_device

    return fp8_dtype_for_device(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_SIZES)
@pytest.mark.parametrize("n,k,g", SHIPPED + ODD)
def test_triton_matches_reference_on_gpu(n, k, g, m):
    qw, sc = gpu_packed(n, k, g)
    a_q, a_s = make_act(m, k, 0, gpu_fp8(), "cuda")
    want = w8.w4a8_gemm_reference(a_q, a_s, qw, sc, g)
    got = w8.w4a8_gemm(a_q, a_s, qw, sc, g)
    # above LARGE_M both operands are rounded to bf16 before cuBLAS (the module doc): 2^-9 relative each
    ok, err = close(got, want, frac=1e-3 if m <= w8.LARGE_M else 2e-2)
    assert ok, err


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64])
def test_head_sized_weight_on_gpu(m):
    qw, sc = gpu_packed(124160, 5120, 128)
    a_q, a_s = make_act(m, 5120, 0, gpu_fp8(), "cuda")
    ok, err = close(w8.w4a8_gemm(a_q, a_s, qw, sc, 128), w8.w4a8_gemm_reference(a_q, a_s, qw, sc, 128))
    assert ok, err


@pytest.mark.gpu
@pytest.mark.parametrize("a_group", [128, -1])
@pytest.mark.parametrize("cfg", [w8.Config(64, 16, 1, 4, 3, 2), w8.Config(128, 16, 4, 4, 3, 4),
                                 w8.Config(64, 32, 2, 4, 3, 8), w8.Config(32, 64, 1, 4, 2, 2),
                                 w8.Config(64, 16, 8, 4, 3, 2, True), w8.Config(128, 64, 2, 4, 3, 2, True)])
def test_kernel_variants_and_scale_layouts_on_gpu(cfg, a_group):
    qw, sc = gpu_packed(5120, 8704, 128)
    for m in (1, 8, 40):
        a_q, a_s = make_act(m, 8704, max(a_group, 0), gpu_fp8(), "cuda")
        if a_group < 0:
            a_s = a_s.max().reshape(1, 1)
        got = w8.w4a8_gemm_triton(a_q, a_s, qw, sc, 128, torch.bfloat16, cfg)
        ok, err = close(got, w8.w4a8_gemm_reference(a_q, a_s, qw, sc, 128))
        assert ok, (m, err)


@pytest.mark.gpu
@pytest.mark.parametrize("mma16", [False, True])
def test_split_k_is_deterministic_and_graph_safe(mma16):
    qw, sc = gpu_packed(5120, 8704, 128)
    a_q, a_s = make_act(8, 8704, 0, gpu_fp8(), "cuda")
    cfg = w8.Config(64, 16, 8, 4, 3, 2, mma16)
    a = w8.w4a8_gemm_triton(a_q, a_s, qw, sc, 128, torch.bfloat16, cfg)
    assert torch.equal(a, w8.w4a8_gemm_triton(a_q, a_s, qw, sc, 128, torch.bfloat16, cfg))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = w8.w4a8_gemm_triton(a_q, a_s, qw, sc, 128, torch.bfloat16, cfg)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, a)


@pytest.mark.gpu
def test_opcheck_on_gpu():
    qw, sc = make_packed(512, 1024, 128, "cuda")
    a_q, a_s = make_act(8, 1024, 0, gpu_fp8(), "cuda")
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")  # as on CPU
    torch.library.opcheck(torch.ops.radiance.w4a8_gemm.default, (a_q, a_s, qw, sc, 128, torch.bfloat16),
                          test_utils=utils)
