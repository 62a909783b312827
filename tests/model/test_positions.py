"""Position variants: sinusoidal relative property, RoPE shift invariance, ALiBi slopes and bias."""

from __future__ import annotations

import math

import pytest
import torch

from scalelab.model import Transformer
from scalelab.model.positions import (
    AlibiPosition,
    RotaryPosition,
    alibi_slopes,
    apply_rope,
    rope_cos_sin,
    sinusoidal_table,
)

from .helpers import tiny


def test_sinusoidal_matches_the_paper() -> None:
    d = 16
    pos = torch.arange(50)
    pe = sinusoidal_table(pos, d)
    for p in (0, 3, 49):
        for i in range(d // 2):
            omega = 10000 ** (-2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(p * omega), abs=1e-5)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(p * omega), abs=1e-5)


def test_sinusoidal_dot_product_depends_only_on_offset() -> None:
    pe = sinusoidal_table(torch.arange(200), 64).double()
    gram = pe @ pe.T
    for k in (0, 1, 7, 50):
        diag = torch.diagonal(gram, offset=k)
        torch.testing.assert_close(diag, torch.full_like(diag, diag[0].item()), atol=1e-4, rtol=0)


def test_rope_score_invariant_to_common_shift() -> None:
    cfg = tiny(position="rope", rope_base=500.0)
    rope = RotaryPosition(cfg)
    q = torch.randn(1, 1, 1, cfg.head_dim)
    k = torch.randn(1, 1, 1, cfg.head_dim)

    def score(p: int, r: int) -> float:
        qr = rope.rotary(torch.tensor([p]))(q)
        kr = rope.rotary(torch.tensor([r]))(k)
        return (qr * kr).sum().item()

    for p, r in [(5, 2), (9, 9), (3, 11)]:
        for shift in (1, 17, 100):
            assert score(p + shift, r + shift) == pytest.approx(score(p, r), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)  # but it does see the offset


def test_rope_is_a_rotation_and_identity_at_zero() -> None:
    x = torch.randn(2, 3, 10, 8)
    cos, sin = rope_cos_sin(torch.arange(10), 8, 10000.0)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])


def test_rope_base_changes_frequencies() -> None:
    c1, _ = rope_cos_sin(torch.arange(4), 8, 10000.0)
    c2, _ = rope_cos_sin(torch.arange(4), 8, 100.0)
    assert not torch.allclose(c1, c2)


def test_alibi_slopes_from_the_paper() -> None:
    assert alibi_slopes(8) == pytest.approx([2.0**-k for k in range(1, 9)])
    assert alibi_slopes(4) == pytest.approx([2.0**-k for k in (2, 4, 6, 8)])
    # non powers of two, as the official implementation: slopes of the lower power of two,
    # then every other slope of the next power of two
    assert alibi_slopes(6) == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    assert alibi_slopes(12) == pytest.approx(
        [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5])


@pytest.mark.parametrize("n_heads", [8, 6, 12])
def test_alibi_bias_is_slope_times_distance(n_heads: int) -> None:
    cfg = tiny(d_model=8 * n_heads, n_heads=n_heads, position="alibi")
    bias = AlibiPosition(cfg).bias(torch.arange(10), torch.arange(10))
    slopes = alibi_slopes(n_heads)
    assert bias.shape == (n_heads, 10, 10)
    for h in range(n_heads):
        for i in range(10):
            for j in range(i + 1):  # keys a causal mask lets through
                assert bias[h, i, j].item() == pytest.approx(slopes[h] * (j - i))


def test_learned_positions_reject_too_long_input() -> None:
    model = Transformer(tiny(position="learned", max_seq_len=8))
    model(torch.zeros(1, 8, dtype=torch.long))  # exactly max_seq_len is fine
    with pytest.raises(ValueError, match=r"positions up to 9.*max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("position", ["sinusoidal", "rope", "alibi", "none"])
def test_tableless_positions_extrapolate(position: str) -> None:
    model = Transformer(tiny(position=position, max_seq_len=8))
    assert model(torch.zeros(1, 12, dtype=torch.long)).shape == (1, 12, 37)


def test_learned_table_shared_by_encoder_and_decoder() -> None:
    model = Transformer(tiny(arch="encoder_decoder", position="learned"))
    tables = [n for n, _ in model.named_parameters() if "pos" in n]
    assert tables == ["pos.table.weight"]
