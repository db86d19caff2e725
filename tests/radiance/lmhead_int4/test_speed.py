"""int4-head's speed rule: the step shapes it times and the verdict it draws (timing itself needs a GPU)."""
from __future__ import annotations

import pytest
import torch

from radiance.lmhead_int4 import speed

SHAPES = speed.Shapes(max_seqs=32, k=4, drafter_shares_head=True, max_rows=2048)


def test_step_shapes_cover_every_batch_up_to_max_num_seqs():
    assert SHAPES.batches() == [1, 2, 4, 8, 16, 32]
    assert SHAPES.calls(8) == [40, 8, 8, 8, 8]          # verification, then one call per MTP slot
    assert speed.Shapes(12, 4, False, 2048).batches() == [1, 2, 4, 8, 12]
    assert speed.Shapes(64, 4, True, 100).calls(64)[0] == 100   # capped by max_num_batched_tokens
    assert speed.Shapes(8, 0, False, 2048).calls(8) == [8]


def test_verdict_declines_where_the_4bit_step_is_slower():
    assert speed.verdict([(1, 50.0, 60.0), (8, 55.0, 70.0)], SHAPES) is None
    why = speed.verdict([(1, 50.0, 60.0), (32, 900.0, 700.0)], SHAPES)
    assert "B=32" in why and "900 vs 700" in why and "1 of 2" in why


def test_shapes_from_a_vllm_config():
    pytest.importorskip("vllm")

    class Sched:
        max_num_seqs, max_num_batched_tokens = 16, 512

    class Spec:
        num_speculative_tokens, method = 3, "mtp"

    class Cfg:
        scheduler_config, speculative_config = Sched, Spec

    assert speed.shapes_from_config(Cfg) == speed.Shapes(16, 3, True, 512)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_compare_times_both_heads_at_every_batch():
    from radiance.kernels import w4a16_gemm as wk
    from radiance.w4 import quant

    w = (torch.randn((4096, 256), device="cuda") * 0.02).to(torch.bfloat16)
    qw, sc = quant.quantize_pack(w, 128, scale_dtype=torch.bfloat16)
    rows = speed.compare(lambda x: torch.nn.functional.linear(x, w), lambda x: wk.gemm(x, qw, sc, 128),
                         256, torch.bfloat16, w.device, speed.Shapes(8, 4, True, 2048))
    assert [b for b, _, _ in rows] == [1, 2, 4, 8] and all(a > 0 and b > 0 for _, a, b in rows)
