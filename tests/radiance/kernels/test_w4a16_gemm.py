"""w4a16_gemm: the reference against an independent dequantise-and-matmul, the op (CPU
dispatch, opcheck, fake/compile), config tables, the Triton kernel in the interpreter on CPU,
AOT builds for gfx1201 / gfx942, and the compiled kernel against the reference on a GPU."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from radiance.kernels import shipped
from radiance.kernels import w4a16_gemm as wk
from radiance.kernels.dispatch import DeviceInfo
from radiance.kernels import w4_layout as layout
from radiance.w4 import quant


# (N, K, G): the drafter's four linears, both lm_heads, and odd ones (N not a multiple of any
# tile, K not a multiple of 128, small and large groups).
DRAFTER = [(3072, 5120, 128), (5120, 2048, 128), (17408, 5120, 128), (5120, 8704, 128)]
LM_HEAD = [(151936, 2048, 128), (248320, 5120, 128)]
# what the shipped profiles launch per rank at TP=2 and the lists above do not hold: Qwen3.5-27B's
# MTP qkv and o, both int4 heads
SHIPPED = sorted({(n, k, shipped.W4A16_GROUP) for n, k in shipped.W4A16.values()} - set(DRAFTER + LM_HEAD))
SHIPPED_HEADS = [s for s in SHIPPED if s[0] > 50000]
ODD = [(1000, 384, 128), (77, 5120, 128), (4100, 320, 64), (333, 512, 256), (130, 96, 32)]
M_SIZES = (1, 3, 8, 16, 33, 64, 200, 520)
# Kernel and reference both accumulate in fp32 and round once to the activation dtype; the
# summation order differs, so a result may land one ulp apart (2^-8 bf16, 2^-11 fp16
# relative). Outputs are O(1) by construction, so atol only covers results near zero.
DTYPE_TOL = [(torch.bfloat16, 1e-2, 2.0 ** -7), (torch.float16, 2e-3, 2.0 ** -9)]


def make_packed(n, k, g, device="cpu", seed=0, scale_dtype=torch.bfloat16):
    """Random words are valid packed weights; scales make every output O(1)."""
    gen = torch.Generator().manual_seed(seed * 7919 + n * 31 + k)
    qshape, sshape = layout.packed_shapes(n, k, g)
    qw = torch.randint(-2**31, 2**31 - 1, qshape, dtype=torch.int32, generator=gen)
    sc = (torch.rand(sshape, generator=gen) + 0.5) / (4.6 * k ** 0.5)
    sc[k // g:] = 0
    return qw.to(device), sc.to(scale_dtype).to(device)


def make_x(m, k, dtype=torch.bfloat16, device="cpu", seed=1):
    gen = torch.Generator().manual_seed(seed * 104729 + m * 13 + k)
    return torch.randn((m, k), generator=gen).to(dtype).to(device)


# --- reference ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,k,g", [(64, 256, 128), (40, 320, 64), (7, 512, 256)])
def test_reference_is_dequantise_then_matmul(n, k, g, dtype):
    qw, sc = make_packed(n, k, g)
    x = make_x(5, k, dtype)
    q, s = layout.unpack(qw, sc, k, g)
    w = q.double() * s.double().repeat_interleave(g, dim=1)
    want = (x.double() @ w.t()).to(dtype)
    got = wk.w4a16_gemm_reference(x, qw, sc, g)
    assert got.dtype == dtype and got.shape == (5, n)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=2.0 ** -7)


def test_reference_row_chunks_do_not_change_the_result(monkeypatch):
    qw, sc = make_packed(300, 256, 128)
    x = make_x(3, 256)
    whole = wk.w4a16_gemm_reference(x, qw, sc, 128)
    real = layout.dequantize
    monkeypatch.setattr(layout, "dequantize", lambda *a, **kw: real(*a, **{**kw, "rows": 7}))
    assert torch.equal(wk.w4a16_gemm_reference(x, qw, sc, 128), whole)


def test_quantised_weight_through_the_op_tracks_the_bf16_matmul():
    w = (torch.randn(256, 512) * 0.02).to(torch.bfloat16)
    qw, sc = quant.quantize_pack(w, 128)
    x = make_x(8, 512)
    got = wk.w4a16_gemm(x, qw, sc, 128).float()
    want = (x.float() @ w.float().t())
    rel = float((got - want).norm() / want.norm())
    assert rel < 0.12  # the 4-bit round trip error, ~0.10 on Gaussian weights


# --- the op ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_op_on_cpu_is_the_reference(dtype):
    qw, sc = make_packed(96, 384, 128)
    x = make_x(4, 384, dtype)
    assert torch.equal(torch.ops.radiance.w4a16_gemm(x, qw, sc, 128), wk.w4a16_gemm_reference(x, qw, sc, 128))


@pytest.mark.parametrize("m", [0, 1, 5])
def test_opcheck(m):
    qw, sc = make_packed(48, 256, 64)
    torch.library.opcheck(torch.ops.radiance.w4a16_gemm.default, (make_x(m, 256), qw, sc, 64))


def test_fake_impl_traces_under_compile():
    qw, sc = make_packed(48, 256, 128)
    fn = torch.compile(lambda x: torch.ops.radiance.w4a16_gemm(x, qw, sc, 128) * 2, backend="aot_eager",
                       fullgraph=True, dynamic=True)
    x = make_x(3, 256)
    assert torch.equal(fn(x), wk.w4a16_gemm_reference(x, qw, sc, 128) * 2)


def test_op_rejects_mismatched_shapes():
    qw, sc = make_packed(48, 256, 128)
    with pytest.raises(ValueError, match="packed shapes"):
        wk.w4a16_gemm(make_x(2, 384), qw, sc, 128)
    with pytest.raises(ValueError, match="group size"):
        wk.w4a16_gemm(make_x(2, 256), qw, sc, 48)


# --- configs -----------------------------------------------------------------------------

def test_m_buckets():
    assert [wk.m_bucket(m) for m in (1, 2, 8, 9, 16, 17, 33, 64)] == [1, 8, 8, 16, 16, 32, 64, 64]


def test_default_config_fills_the_gpu_with_split_k_only_when_needed():
    small = wk.default_config(8, 3072, 5120, num_sms=132)
    assert small.split_k > 1 and small.block_m == 16
    head = wk.default_config(8, 248320, 5120, num_sms=132)
    assert head.split_k == 1 and head.block_n == 128
    assert wk.default_config(64, 5120, 2048).block_m == 64


def test_table_lookup_and_fallbacks(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(wk, "CONFIG_DIR", tmp_path)
    wk.clear_caches()
    entry = {"n": 3072, "k": 5120, "group_size": 128, "m": 8,
             "config": {"block_n": 32, "block_m": 16, "split_k": 8, "num_warps": 4, "num_stages": 5}}
    (tmp_path / "testdev.json").write_text(json.dumps({"configs": [entry]}))
    dev = DeviceInfo("cuda", "sm90", 100, "testdev")
    try:
        for m in (2, 8):
            assert wk.config_for(m, 3072, 5120, 128, dev) == wk.Config(32, 16, 8, 4, 5)
        # an M bucket or shape that is not tuned runs with the default config for the device
        assert wk.config_for(16, 3072, 5120, 128, dev) == wk.default_config(16, 3072, 5120, 100)
        assert wk.config_for(8, 4096, 4096, 128, dev) == wk.default_config(8, 4096, 4096, 100)
        # the CPU (the interpreter) has no table and plans for 132 SMs
        assert wk.lookup_config(8, 3072, 5120, 128, torch.device("cpu")) == wk.default_config(8, 3072, 5120)
        (tmp_path / "testdev.json").write_text("{not json")
        wk.clear_caches()
        assert wk.config_for(8, 3072, 5120, 128, dev) == wk.default_config(8, 3072, 5120, 100)
        assert "ignoring unreadable" in caplog.text
    finally:
        wk.clear_caches()


def test_shipped_tables_parse():
    for path in sorted(wk.CONFIG_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        for e in data["configs"]:
            cfg = wk.Config(**e["config"])
            assert cfg.block_n % 16 == 0 and cfg.block_m in (8, 16, 32, 64) and cfg.split_k >= 1
            assert e["m"] in wk.TUNED_M


# --- Triton vs reference: interpreter on CPU ---------------------------------------------

_INTERPRET = textwrap.dedent("""
    import torch
    from radiance.kernels import w4a16_gemm as wk
    from test_w4a16_gemm import make_packed, make_x
    C = wk.Config
    bad = []
    cases = [  # m, n, k, g, config, dtype
        (8, 64, 256, 128, C(64, 16, 1, 4, 2), torch.bfloat16),
        (3, 50, 384, 128, C(32, 16, 2, 4, 2), torch.bfloat16),      # split-K, odd N
        (5, 40, 320, 64, C(32, 16, 3, 4, 2), torch.float16),        # K % 128 != 0, 3 splits
        (17, 33, 256, 256, C(16, 32, 1, 4, 2), torch.bfloat16),     # group > 128
        (2, 16, 96, 32, C(16, 16, 1, 4, 2), torch.float16),         # group < 64, K < 128
        (70, 24, 128, 128, C(16, 64, 2, 4, 2), torch.bfloat16),     # two M tiles, split-K
        (1, 20, 640, 128, C(16, 8, 8, 4, 2), torch.bfloat16),       # more splits than needed
        (3, 50, 640, 128, C(32, 16, 2, 4, 2), torch.bfloat16),      # a short last split
        (8, 64, 384, 64, C(64, 16, 1, 4, 2), torch.float16),        # an odd K-block count
    ]
    for m, n, k, g, cfg, dt in cases:
        qw, sc = make_packed(n, k, g, scale_dtype=dt)
        x = make_x(m, k, dt)
        a = wk.w4a16_gemm_triton(x, qw, sc, g, cfg)
        b = wk.w4a16_gemm_reference(x, qw, sc, g)
        tol = dict(atol=1e-2, rtol=2.0 ** -7) if dt == torch.bfloat16 else dict(atol=2e-3, rtol=2.0 ** -9)
        again = wk.w4a16_gemm_triton(x, qw, sc, g, cfg)   # the split-K tickets were reset
        if not (torch.allclose(a.float(), b.float(), **tol) and torch.equal(a, again)):
            bad.append((m, n, k, g, str(dt), float((a.float() - b.float()).abs().max())))
    print("MISMATCH", bad) if bad else print("OK")
""")


def test_triton_interpreter_matches_reference(interpreter_ok):
    interpreter_ok(_INTERPRET, timeout=900)


# --- AOT ---------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gfx1201", "gfx942", "sm90"])
def test_aot_compiles(arch, aot_specs, aot_compile):
    specs = aot_specs("w4a16_gemm", arch)
    # every tile of 16, 32 and 64 rows is there (the decode band and the M tiling above it), and
    # the PTX unpack only on NVIDIA
    assert {s.constexprs["BLOCK_M"] for s in specs} >= {16, 32, 64}
    assert all(s.constexprs["USE_ASM"] == (arch == "sm90") and not s.constexprs["INTERPRET"] for s in specs)
    for spec in (specs[0], specs[-1]):  # `make aot` compiles every one; two keep this test short
        aot_compile(spec, arch)


# --- Triton vs reference on a GPU --------------------------------------------------------

_PACKED: dict = {}


def gpu_packed(n, k, g, dtype):
    key = (n, k, g, dtype)
    if key not in _PACKED:
        _PACKED.clear()  # the lm_head weights are large; keep one shape at a time
        _PACKED[key] = make_packed(n, k, g, "cuda", scale_dtype=dtype)
    return _PACKED[key]


# fp16 runs on the drafter and odd shapes; the heads (the largest weights) in bf16, what the profiles serve.
GPU_CASES = [(n, k, g, *tol) for (n, k, g) in DRAFTER + LM_HEAD + ODD + SHIPPED for tol in DTYPE_TOL
             if not (tol[0] == torch.float16 and (n, k, g) in LM_HEAD + SHIPPED_HEADS)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", M_SIZES)
@pytest.mark.parametrize("n,k,g,dtype,atol,rtol", GPU_CASES)
def test_triton_matches_reference_on_gpu(n, k, g, m, dtype, atol, rtol):
    qw, sc = gpu_packed(n, k, g, dtype)
    x = make_x(m, k, dtype, "cuda")
    want = wk.w4a16_gemm_reference(x, qw, sc, g)
    got = torch.ops.radiance.w4a16_gemm(x, qw, sc, g)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", DTYPE_TOL)
@pytest.mark.parametrize("m", [1, 8, 33])
@pytest.mark.parametrize("n,k,g,cfg", [
    (5120, 8704, 128, wk.Config(128, 16, 8, 4, 3)),
    (4100, 320, 64, wk.Config(64, 16, 2, 4, 3)),
    (333, 512, 256, wk.Config(64, 64, 1, 4, 3)),
    (3072, 5120, 128, wk.Config(64, 16, 4, 4, 5)),
])
def test_kernel_variants_match_reference_on_gpu(n, k, g, cfg, m, dtype, atol, rtol):
    """Configs the tuner may pick (tiles, split-K, pipeline depth), at ragged N, K and groups."""
    qw, sc = gpu_packed(n, k, g, dtype)
    x = make_x(m, k, dtype, "cuda")
    want = wk.w4a16_gemm_reference(x, qw, sc, g)
    torch.testing.assert_close(wk.w4a16_gemm_triton(x, qw, sc, g, cfg), want, atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [wk.LARGE_M + 1, 2048])
def test_large_m_dequantise_path_on_gpu(m):
    qw, sc = make_packed(3072, 5120, 128, "cuda")
    x = make_x(m, 5120, device="cuda")
    want = wk.w4a16_gemm_reference(x, qw, sc, 128)
    # the weight is rounded to bf16 on this path (relative 2^-9 per weight)
    torch.testing.assert_close(torch.ops.radiance.w4a16_gemm(x, qw, sc, 128), want, atol=3e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,g", SHIPPED_HEADS)
def test_large_verification_batch_on_the_heads_on_gpu(n, k, g):
    """A verification step of 220 requests x (k + 1 = 5) rows: past LARGE_M, the dequantise path."""
    qw, sc = gpu_packed(n, k, g, torch.bfloat16)
    x = make_x(1100, k, device="cuda")
    want = wk.w4a16_gemm_reference(x, qw, sc, g)
    torch.testing.assert_close(torch.ops.radiance.w4a16_gemm(x, qw, sc, g), want, atol=3e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 4, 8])
def test_split_k_is_deterministic_and_graph_safe(split):
    qw, sc = make_packed(3072, 5120, 128, "cuda")
    x = make_x(8, 5120, device="cuda")
    cfg = wk.Config(64, 16, split, 4, 3)
    one = wk.w4a16_gemm_triton(x, qw, sc, 128, wk.Config(64, 16, 1, 4, 3))
    a = wk.w4a16_gemm_triton(x, qw, sc, 128, cfg)
    b = wk.w4a16_gemm_triton(x, qw, sc, 128, cfg)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, one, atol=1e-2, rtol=2.0 ** -7)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = wk.w4a16_gemm_triton(x, qw, sc, 128, cfg)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, a)


@pytest.mark.gpu
def test_opcheck_on_gpu():
    qw, sc = make_packed(512, 1024, 128, "cuda")
    torch.library.opcheck(torch.ops.radiance.w4a16_gemm.default, (make_x(8, 1024, device="cuda"), qw, sc, 128))
