"""LayerNorm and RMSNorm match their formulas and torch's functional references."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scalelab.model.norms import LayerNorm, RMSNorm, build_norm

from .helpers import tiny


def _randomize(norm: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))


def test_layernorm_formula_and_reference() -> None:
    cfg = tiny(norm="layernorm")
    norm = LayerNorm(cfg)
    _randomize(norm)
    x = torch.randn(3, 5, cfg.d_model) * 3 + 1
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    expected = (x - mean) / torch.sqrt(var + cfg.norm_eps) * norm.weight + norm.bias
    torch.testing.assert_close(norm(x), expected)
    ref = F.layer_norm(x, (cfg.d_model,), norm.weight, norm.bias, cfg.norm_eps)
    torch.testing.assert_close(norm(x), ref)


def test_layernorm_without_bias_has_only_a_gain() -> None:
    norm = LayerNorm(tiny(bias=False))
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    x = torch.randn(2, 4, 32)
    torch.testing.assert_close(norm(x), F.layer_norm(x, (32,), norm.weight, None, 1e-5))


def test_rmsnorm_formula_and_reference() -> None:
    cfg = tiny(norm="rmsnorm", norm_eps=1e-6)
    norm = RMSNorm(cfg)
    _randomize(norm)
    x = torch.randn(3, 5, cfg.d_model) * 3 + 1
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (cfg.d_model,), norm.weight, cfg.norm_eps))
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_rmsnorm_keeps_dtype() -> None:
    norm = RMSNorm(tiny(norm="rmsnorm"))
    assert norm(torch.randn(2, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_build_norm_by_name() -> None:
    assert isinstance(build_norm(tiny(norm="rmsnorm")), RMSNorm)
    assert isinstance(build_norm(tiny(norm="layernorm")), LayerNorm)
