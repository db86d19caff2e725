"""draft_confidence: Triton equals the reference (ids and max exact, sum-exp to fp32 rounding)."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from radiance.kernels import draft_confidence as dc
from radiance.kernels import shipped
from radiance.kernels.dispatch import DeviceInfo
from radiance.kernels.draft_confidence import (
    Config,
    draft_confidence,
    draft_confidence_reference,
    draft_confidence_triton,
    draft_top1,
    draft_top1_reference,
    draft_top1_triton,
    split_plan,
)

# (dtype, atol, rtol) for sum-exp: a sum of up to 2.5e5 fp32 terms in another order differs by
# ~1e-5 relative; max is exact (a max of exactly converted values), argmax is exact.
DTYPES = [(torch.float32, 0.0, 3e-5), (torch.bfloat16, 0.0, 3e-5), (torch.float16, 0.0, 3e-5)]
# (rows, columns, n_valid): -1 = all columns valid
SHAPES = [(1, 17, -1), (3, 1000, 990), (8, 4096, -1), (8, 248320, -1), (64, 248320, -1),
          (5, 248320 // 2, 248320 // 2 - 37), (200, 32000, -1), (2, 70000, 0)]
# the vocabulary shards per rank at TP=2 (Qwen3.5-27B, Qwen3-Next-80B) at the decode batches
SHAPES += [(b, v, v) for v in shipped.DRAFT_VOCAB_SHARDS for b in shipped.DRAFT_DECODE_B + (64,)]


def make_logits(rows, cols, dtype, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 4
    if cols > 10:
        x[0, cols // 3] = x[0, cols - 2] = 80.0  # a tie: the lower column must win
    return x.to(dtype).to(device)


def check(got, want, atol, rtol):
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=atol, rtol=rtol)
    assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("rows,cols,n_valid", [(3, 1000, 990), (2, 70000, 0), (4, 5, -1)])
def test_op_on_cpu_is_the_reference(rows, cols, n_valid, dtype, atol, rtol):
    x = make_logits(rows, cols, dtype, "cpu", rows + cols)
    check(draft_confidence(x, n_valid), draft_confidence_reference(x, n_valid), atol, rtol)


def test_reference_semantics():
    x = torch.tensor([[1.0, 3.0, 3.0, 9.0], [float("-inf")] * 4])
    m, s, i = draft_confidence_reference(x, 3)  # column 3 is padding: 9.0 must not count
    assert m.tolist() == [3.0, float("-inf")]
    assert i.tolist() == [1, 0]  # first of the tied maxima; an all -inf row reports column 0
    torch.testing.assert_close(s[0], 2.0 + torch.exp(torch.tensor(-2.0)))
    assert s[1] == 0
    full = torch.randn(4, 300)
    m, s, i = draft_confidence_reference(full)
    torch.testing.assert_close(1.0 / s, torch.softmax(full, -1).max(-1).values)


def check_top1(got, want):
    """Token and host row exact: the probability divides the sum (equal up to its fp32 rounding,
    so compared as floats) with IEEE rounding on both sides."""
    token, row = got
    assert token.dtype == torch.int64 and row.dtype == torch.int32 and row.shape == (2 * token.shape[0],)
    assert torch.equal(token, want[0])
    b = token.shape[0]
    assert torch.equal(row[:b], want[1][:b]) and torch.equal(row[:b].long(), token)
    torch.testing.assert_close(row[b:].view(torch.float32), want[1][b:].view(torch.float32), atol=0, rtol=3e-5)


def test_top1_reference_is_the_token_and_its_probability():
    x = make_logits(5, 3000, torch.bfloat16, "cpu", 9)
    token, row = draft_top1_reference(x, 2990)
    _, total, idx = draft_confidence_reference(x, 2990)
    assert torch.equal(token, idx) and torch.equal(row[:5], idx.to(torch.int32))
    assert torch.equal(row[5:].view(torch.float32), 1.0 / total)
    torch.testing.assert_close(row[5:].view(torch.float32),
                               torch.softmax(x[:, :2990].float(), -1).max(-1).values)
    check_top1(draft_top1(x, 2990), (token, row))  # the op on CPU is the reference


def test_opcheck_top1_cpu():
    torch.library.opcheck(torch.ops.radiance.draft_top1, (make_logits(3, 500, torch.bfloat16, "cpu", 0), 500))


def test_opcheck_cpu():
    torch.library.opcheck(torch.ops.radiance.draft_confidence,
                          (make_logits(3, 500, torch.bfloat16, "cpu", 0), 490))


@pytest.mark.parametrize("rows,cols,sms", [(8, 248320, 132), (64, 248320, 132), (1, 17, 132),
                                           (512, 248320, 132), (1, 10 ** 7, 132)])
@pytest.mark.parametrize("block,unroll,pps", [(2048, 1, 8), (1024, 4, 16), (4096, 2, 4)])
def test_split_plan_covers_every_column(rows, cols, sms, block, unroll, pps):
    split_cols, nsplit = split_plan(rows, cols, sms, block, pps, unroll)
    assert 1 <= nsplit <= dc.MAX_SPLITS
    assert split_cols % (block * unroll) == 0  # the unmasked loop runs whole chunks
    assert split_cols * nsplit >= cols > split_cols * (nsplit - 1)


def test_config_table(tmp_path, monkeypatch):
    """A batch uses the entry of the smallest tuned batch >= it (past the end, the largest) from
    the entries tuned at the columns nearest its own (entries without "cols": V = 248320); a
    broken table falls back to the default."""
    monkeypatch.setattr(dc, "CONFIG_DIR", tmp_path)
    dc.load_table.cache_clear()
    (tmp_path / "fake_gpu.json").write_text(json.dumps({"configs": [
        {"rows": 64, "config": {"block": 1024, "unroll": 4, "num_warps": 4, "programs_per_sm": 8}},
        {"rows": 8, "config": {"block": 2048, "unroll": 1, "num_warps": 8, "programs_per_sm": 16}},
        {"rows": 8, "cols": 75968, "config": {"block": 256, "unroll": 2, "num_warps": 1, "programs_per_sm": 8}},
    ]}))
    gpu = DeviceInfo("cuda", "sm90", 132, "fake_gpu")
    try:
        assert dc.plan_config(1, 248320, gpu) == dc.plan_config(8, 248320, gpu) == Config(2048, 1, 8, 16)
        assert dc.plan_config(9, 248320, gpu) == dc.plan_config(500, 248320, gpu) == Config(1024, 4, 4, 8)
        assert dc.plan_config(8, 170000, gpu) == Config(2048, 1, 8, 16)  # nearer 248320 than 75968
        assert dc.plan_config(8, 75968, gpu) == dc.plan_config(64, 70000, gpu) == Config(256, 2, 1, 8)
        assert dc.config_for(8, torch.device("cpu")) == dc.DEFAULT_CONFIG
        (tmp_path / "fake_gpu.json").write_text("{not json")
        dc.load_table.cache_clear()
        assert dc.plan_config(8, 248320, gpu) == dc.DEFAULT_CONFIG
    finally:
        dc.load_table.cache_clear()


def test_shipped_tables_parse():
    for path in sorted(dc.CONFIG_DIR.glob("*.json")):
        table = dc.load_table(path.stem)
        assert table, path
        for cols, entries in table.items():
            assert cols >= 1 and entries
            for rows, cfg in entries:
                assert rows >= 1 and cfg.unroll in (1, 2, 4, 8) and cfg.block & (cfg.block - 1) == 0
                assert cfg.stages >= 1 and cfg.programs_per_sm >= 1


def test_h200_table_covers_the_shipped_vocabularies():
    table = dc.load_table("nvidia_h200")
    for cols in shipped.DRAFT_VOCAB_SHARDS:
        assert cols in table and {1, 8} <= {rows for rows, _ in table[cols]}


_INTERPRETER_CHECK = textwrap.dedent("""
    import torch
    from radiance.kernels import draft_confidence as dc
    from radiance.kernels.draft_confidence import Config, draft_confidence_reference
    g = torch.Generator().manual_seed(0)
    cases = [(3, 20000, -1, torch.float32), (2, 9000, 8999, torch.bfloat16),
             (2, 5000, 0, torch.float32), (1, 7, -1, torch.float16),
             (3, 6000, 4097, torch.bfloat16)]
    configs = [Config(512, 2, 4, 2), Config(1024, 1, 4, 2), Config(256, 4, 4, 2),
               Config(256, 2, 4, 1, 3), Config(512, 4, 4, 2, 2), Config(512, 1, 4, 1, 4),
               Config(256, 8, 1, 2), Config(128, 8, 1, 1, 3)]
    for (rows, cols, n_valid, dtype), cfg in [(c, k) for c in cases for k in configs]:
        x = (torch.randn(rows, cols, generator=g) * 4).to(dtype)
        if cols > 100:
            x[0, 11] = x[0, cols // 2] = 90
            x[1, 4097] = x[1, 5] = 91  # a tie between lanes, and across tiles
            if rows > 2:  # mostly -inf: lanes that see only -inf, a tie among the few finite
                x[2] = float("-inf")
                x[2, 3000:3010] = -5.0
                x[2, 3005] = x[2, 100] = -1.0
        for _ in range(2):  # the second launch checks that the arrival counters reset
            got = dc._launch(x, n_valid, cfg)
            want = draft_confidence_reference(x, n_valid)
            assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]), (got, want)
            torch.testing.assert_close(got[1], want[1], rtol=3e-5, atol=0)
        token, row = dc._launch(x, n_valid, cfg, packed=True)
        assert torch.equal(token, want[2]) and torch.equal(row[:rows].long(), want[2])
        torch.testing.assert_close(row[rows:].view(torch.float32), 1.0 / want[1], rtol=3e-5, atol=0)
    x = (torch.randn(4, 9000, generator=g) * 4)[:, 100:7100]  # strided rows
    got, want = dc._launch(x, -1, configs[0]), draft_confidence_reference(x, -1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1], rtol=3e-5, atol=0)
    print("ok")
""")


def test_triton_kernel_in_the_interpreter(run_interpreted):
    out = run_interpreted(_INTERPRETER_CHECK)
    assert "ok" in out, out[-3000:]


def test_aot_compiles(aot_arch, aot_specs, aot_compile):
    mine = aot_specs("draft_confidence", aot_arch)
    assert mine
    for spec in mine:
        aot_compile(spec, aot_arch)




@pytest.mark.gpu
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("rows,cols,n_valid", SHAPES)
def test_triton_equals_reference_on_gpu(rows, cols, n_valid, dtype, atol, rtol):
    x = make_logits(rows, cols, dtype, "cuda", rows * 31 + cols)
    want = draft_confidence_reference(x, n_valid)
    for _ in range(3):  # repeated launches reuse the self-resetting counters
        check(draft_confidence_triton(x, n_valid), want, atol, rtol)
    check(draft_confidence(x, n_valid), want, atol, rtol)


GPU_CONFIGS = [Config(1024, 1, 4, 8), Config(1024, 4, 4, 8, 3), Config(2048, 2, 4, 16, 2),
               Config(4096, 1, 8, 4), Config(2048, 4, 8, 12, 4), Config(256, 2, 1, 8, 3),
               Config(256, 8, 1, 16, 4), Config(512, 8, 2, 8, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols,n_valid", [(8, 248320, -1), (64, 248320, 248320 - 3),
                                               (3, 70001, 69999)])
def test_launch_configs_on_gpu(rows, cols, n_valid, dtype):
    x = make_logits(rows, cols, dtype, "cuda", rows + cols)
    x[1, 5] = x[1, 4097] = 85.0
    x[2] = float("-inf")  # a row that is -inf but for a tie of two finite values
    x[2, 7] = x[2, 30000] = -3.0
    want = draft_confidence_reference(x, n_valid)
    for cfg in GPU_CONFIGS:
        for _ in range(2):  # the first call plans the launch, the second reuses the plan
            check(dc._launch(x, n_valid, cfg), want, 0.0, 3e-5)


@pytest.mark.gpu
def test_cuda_graph_replay_on_gpu():
    """Captured once, replayed on new contents: the counters reset inside every replay."""
    x = make_logits(8, 248320, torch.bfloat16, "cuda", 5)
    draft_confidence(x, -1)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draft_confidence(x, -1)
    for seed in range(3):
        x.copy_(make_logits(8, 248320, torch.bfloat16, "cuda", 100 + seed))
        graph.replay()
        check(out, draft_confidence_reference(x, -1), 0.0, 3e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,cols", [(1, 248320), (8, 248320), (32, 248320), (64, 151936), (3, 1000)])
def test_top1_equals_reference_on_gpu(rows, cols, dtype):
    x = make_logits(rows, cols, dtype, "cuda", rows * 7 + cols)
    want = draft_top1_reference(x, cols)
    for _ in range(3):
        check_top1(draft_top1_triton(x, cols), want)
    check_top1(draft_top1(x, cols), want)
    # the probability is exactly 1 / the kernel's own sum (IEEE division, as torch's)
    _, total, _ = draft_confidence_triton(x, cols)
    assert torch.equal(draft_top1(x, cols)[1][rows:].view(torch.float32), 1.0 / total)


@pytest.mark.gpu
def test_top1_cuda_graph_replay_on_gpu():
    x = make_logits(8, 248320, torch.bfloat16, "cuda", 5)
    draft_top1(x, 248320)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draft_top1(x, 248320)
    for seed in range(3):
        x.copy_(make_logits(8, 248320, torch.bfloat16, "cuda", 200 + seed))
        graph.replay()
        check_top1(out, draft_top1_reference(x, 248320))


@pytest.mark.gpu
def test_strided_rows_on_gpu():
    x = make_logits(6, 50000, torch.bfloat16, "cuda", 3)[:, 100:40100]
    check(draft_confidence_triton(x, -1), draft_confidence_reference(x, -1), 0.0, 3e-5)


@pytest.mark.gpu
def test_opcheck_gpu():
    torch.library.opcheck(torch.ops.radiance.draft_confidence,
                          (make_logits(8, 248320, torch.bfloat16, "cuda", 1), -1))
