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


def test_plan_takes_4_bits_up_to_where_they_start_to_lose():
    # the 27B head's shape of costs on the H200: 4 bits win to 80 rows, lose at 160
    cost = {1: (200.0, 595.0), 8: (208.0, 604.0), 40: (471.0, 620.0), 80: (781.0, 830.0), 160: (1692.0, 653.0)}
    p = speed.plan(cost)
    assert p == speed.Plan(w4_max_rows=80, lost_at=(160, 1692.0, 653.0)) and p.keeps_bf16
    shapes = speed.Shapes(max_seqs=32, k=4, drafter_shares_head=False, max_rows=2048)
    steps = dict((b, (w4, bf)) for b, w4, bf in speed.step_costs({**cost, 5: (201.0, 596.0), 2: (200.0, 595.0),
                                                                   4: (200.0, 595.0), 10: (210.0, 605.0),
                                                                   16: (220.0, 606.0), 20: (230.0, 607.0),
                                                                   32: (283.0, 616.0)}, shapes, p.w4_max_rows))
    assert steps[32] == (653.0, 653.0)      # B=32 verifies 160 rows: the bf16 head serves that call
    assert steps[8] == (471.0, 620.0)       # 40 rows: 4 bits
    assert all(w4 <= bf for w4, bf in steps.values())


def test_plan_frees_bf16_where_4_bits_always_win_and_declines_where_they_never_do():
    free = speed.plan({1: (50.0, 60.0), 40: (55.0, 70.0)})
    assert free == speed.Plan(40) and not free.keeps_bf16
    tiny = speed.plan({5: (76.0, 23.0), 160: (81.0, 21.0)})
    assert tiny.w4_max_rows == 0 and "already at 5 rows (76 vs 23 µs" in tiny.reason and not tiny.keeps_bf16


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
def test_time_rows_times_both_heads_at_every_row_count():
    from radiance.kernels import w4a16_gemm as wk
    from radiance.w4 import quant

    w = (torch.randn((4096, 256), device="cuda") * 0.02).to(torch.bfloat16)
    qw, sc = quant.quantize_pack(w, 128, scale_dtype=torch.bfloat16)
    cost = speed.time_rows(lambda x: torch.nn.functional.linear(x, w), lambda x: wk.gemm(x, qw, sc, 128),
                           256, torch.bfloat16, w.device, speed.step_rows(speed.Shapes(8, 4, True, 2048)))
    assert sorted(cost) == [1, 2, 4, 5, 8, 10, 20, 40] and all(a > 0 and b > 0 for a, b in cost.values())
