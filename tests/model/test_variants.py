"""Each registered variant class has exactly the parameters its row in variants.py promises.

The lists come from the registries, so a new MLP, norm or position scheme is checked here
(and in the exact-count grid of test_accounting.py) without editing any test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalelab.model.mlp import MLP_CLASSES, GatedMLP
from scalelab.model.norms import NORM_CLASSES
from scalelab.model.positions import POSITION_CLASSES
from scalelab.model.variants import MLPS, NORMS, POSITIONS

from .helpers import tiny


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", sorted(MLP_CLASSES))
def test_mlp_matches_its_row(name: str, bias: bool) -> None:
    for d_ff in (None, 50):
        cfg = tiny(mlp=name, bias=bias, d_ff=d_ff)
        assert cfg.d_ff == (d_ff or MLPS[name].default_d_ff(cfg.d_model, cfg.ffn_multiple_of))
        mlp = MLP_CLASSES[name](cfg)
        assert numel(mlp) == MLPS[name].n_params(cfg.d_model, cfg.d_ff, bias)
        assert mlp.down.residual_out  # scaled by the GPT-2 init
        assert (MLPS[name].n_in == 2) == isinstance(mlp, GatedMLP)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", sorted(NORM_CLASSES))
def test_norm_matches_its_row(name: str, bias: bool) -> None:
    cfg = tiny(norm=name, bias=bias)
    assert numel(NORM_CLASSES[name](cfg)) == NORMS[name].n_params(cfg.d_model, bias)


@pytest.mark.parametrize("name", sorted(POSITION_CLASSES))
def test_position_matches_its_row(name: str) -> None:
    cfg = tiny(position=name)
    assert numel(POSITION_CLASSES[name](cfg)) == POSITIONS[name].n_params(cfg.max_seq_len,
                                                                          cfg.d_model)


def test_gated_mlps_hidden_size_is_rounded_up() -> None:
    for name in (n for n, row in MLPS.items() if row.n_in == 2):
        assert tiny(d_model=128, mlp=name).d_ff == 352  # int(8*128/3) = 341 -> 352


def test_geglu_is_gelu_gated() -> None:
    """down(gelu_tanh(gate(x)) * up(x)) (Shazeer 2020), written out from the weights."""
    mlp = MLP_CLASSES["geglu"](tiny(mlp="geglu"))
    x = torch.randn(2, 5, 32)
    gate = F.linear(x, mlp.gate.weight, mlp.gate.bias)
    up = F.linear(x, mlp.up.weight, mlp.up.bias)
    expected = F.linear(F.gelu(gate, approximate="tanh") * up, mlp.down.weight, mlp.down.bias)
    torch.testing.assert_close(mlp(x), expected)


def test_gelu_exact_is_the_erf_gelu_in_the_mlp_and_the_mlm_head() -> None:
    cfg = tiny(mlp="gelu_exact")
    mlp = MLP_CLASSES["gelu_exact"](cfg)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(mlp(x), mlp.down(F.gelu(mlp.up(x))))
    tanh = MLP_CLASSES["gelu"](tiny())
    tanh.load_state_dict(mlp.state_dict())  # same weights and layout: only the activation differs
    assert 0 < float((tanh(x) - mlp(x)).detach().abs().max()) < 1e-3
    from scalelab.model.mlp import MLMTransform

    head = MLMTransform(cfg)
    torch.testing.assert_close(head(x), head.norm(F.gelu(head.dense(x))))


def test_swiglu_is_silu_gated() -> None:
    mlp = MLP_CLASSES["swiglu"](tiny(mlp="swiglu"))
    x = torch.randn(2, 5, 32)
    expected = mlp.down(F.silu(mlp.gate(x)) * mlp.up(x))
    torch.testing.assert_close(mlp(x), expected)
