"""The symmetric group quantiser: optimal codes for the rounded scale, clip search, chunking."""
import pytest
import torch

from radiance.kernels import w4_layout as layout
from radiance.w4 import quant


def _weights(n=64, k=512, seed=0, heavy=False):
    gen = torch.Generator().manual_seed(seed)
    if heavy:
        w = torch.distributions.StudentT(3.0).sample((n, k))
    else:
        w = torch.randn((n, k), generator=gen)
    return (w * 0.02).to(torch.bfloat16)


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_codes_are_optimal_for_the_rounded_scale(scale_dtype):
    w = _weights()
    q, s = quant.quantize_rows(w, 128, scale_dtype)
    assert q.dtype == torch.int8 and s.dtype == scale_dtype
    assert int(q.min()) >= -8 and int(q.max()) <= 7
    # round-to-nearest against the scale as stored, i.e. after rounding to scale_dtype
    s32 = s.float().repeat_interleave(128, dim=1)
    want = torch.round(w.float() / s32).clamp(-8, 7)
    assert torch.equal(q.float(), want)


def test_clip_search_never_loses_to_absmax_per_group():
    w = _weights(heavy=True)
    q1, s1 = quant.quantize_rows(w, 128, torch.bfloat16, shrink=(1.0,))
    q2, s2 = quant.quantize_rows(w, 128, torch.bfloat16)

    def group_err(q, s):
        d = q.float().view(64, 4, 128) * s.float().unsqueeze(-1) - w.float().view(64, 4, 128)
        return d.square().sum(-1)

    e1, e2 = group_err(q1, s1), group_err(q2, s2)
    assert bool((e2 <= e1).all())
    assert float(e2.sum()) < 0.95 * float(e1.sum())   # heavy tails: clipping pays
    # chosen per (row, group) independently: the winning shrink factor varies across groups
    ratio = (s2.float() / s1.float()).flatten()
    assert float(ratio.max() - ratio.min()) > 0.1


def test_chunked_equals_unchunked_and_error_is_sane():
    w = _weights(n=37, k=384)
    a = quant.quantize_pack(w, 128, rows=5)
    b = quant.quantize_pack(w, 128, rows=4096)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert 0.05 < quant.roundtrip_error(w, *a, 128) < 0.12


def test_quantiser_works_in_row_chunks(monkeypatch):
    seen = []
    real = quant.quantize_rows
    monkeypatch.setattr(quant, "quantize_rows", lambda w, *a, **k: (seen.append(w.shape[0]), real(w, *a, **k))[1])
    quant.quantize_pack(_weights(n=100, k=256), 128, rows=16)
    assert max(seen) == 16 and sum(seen) == 100


def test_zero_rows_give_zero_codes_and_scales():
    w = _weights(n=8, k=256)
    w[3:6] = 0
    qw, sc = quant.quantize_pack(w, 128)
    q, s = layout.unpack(qw, sc, 256, 128)
    assert not torch.isnan(s.float()).any()
    assert torch.equal(q[3:6], torch.zeros((3, 256), dtype=torch.int8))
    assert torch.equal(s[3:6].float(), torch.zeros((3, 2)))


def test_non_finite_weights_are_refused():
    w = _weights(n=4, k=128)
    w[1, 5] = float("inf")
    with pytest.raises(ValueError, match="inf or NaN"):
        quant.quantize_pack(w, 128)


def test_group_64_and_fp32_input_default_to_bf16_scales():
    w = _weights(n=8, k=192).float()
    _, sc = quant.quantize_pack(w, 64)
    # K = 192 pads to Kp = 256: four groups of 64, the last one padding
    assert sc.dtype == torch.bfloat16 and tuple(sc.shape) == (4, 8)
    assert torch.equal(sc[3].float(), torch.zeros(8))
