"""Pre-LN and post-LN blocks match references computed by hand from the same weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalelab.model.blocks import Block, CrossBlock, PostNorm, PreNorm, Stack

from .helpers import context, on_rows, ref_attention, tiny


def _ln(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, 1e-5)


def _mlp(x: torch.Tensor, mlp: torch.nn.Module) -> torch.Tensor:
    return mlp.down(F.gelu(mlp.up(x), approximate="tanh"))


def _randomize_norms(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)


def test_pre_ln_block_is_x_plus_f_of_norm_x() -> None:
    block = Block(tiny(norm_position="pre")).eval()
    _randomize_norms(block)
    assert isinstance(block.self_attn, PreNorm)
    x = torch.randn(2, 6, 32)
    sa, ff = block.self_attn, block.mlp
    h = x + ref_attention(sa.fn, _ln(x, sa.norm), causal=True)
    expected = h + _mlp(_ln(h, ff.norm), ff.fn)
    torch.testing.assert_close(on_rows(block, x, context(x, is_causal=True)), expected)


def test_post_ln_block_is_norm_of_x_plus_f_x() -> None:
    block = Block(tiny(norm_position="post")).eval()
    _randomize_norms(block)
    assert isinstance(block.self_attn, PostNorm)
    x = torch.randn(2, 6, 32)
    sa, ff = block.self_attn, block.mlp
    h = _ln(x + ref_attention(sa.fn, x, causal=False), sa.norm)
    expected = _ln(h + _mlp(h, ff.fn), ff.norm)
    torch.testing.assert_close(on_rows(block, x, context(x, is_causal=False)), expected)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_cross_block_order_self_cross_mlp(norm_position: str) -> None:
    block = CrossBlock(tiny(norm_position=norm_position)).eval()
    _randomize_norms(block)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    sa, ca, ff = block.self_attn, block.cross_attn, block.mlp
    if norm_position == "pre":
        h = x + ref_attention(sa.fn, _ln(x, sa.norm), causal=True)
        h = h + ref_attention(ca.fn, _ln(h, ca.norm), memory=memory)
        expected = h + _mlp(_ln(h, ff.norm), ff.fn)
    else:
        h = _ln(x + ref_attention(sa.fn, x, causal=True), sa.norm)
        h = _ln(h + ref_attention(ca.fn, h, memory=memory), ca.norm)
        expected = _ln(h + _mlp(h, ff.fn), ff.norm)
    out = on_rows(block, x, context(x, is_causal=True), memory=memory,
                  cross_ctx=context(x, k_len=memory.shape[1]))
    torch.testing.assert_close(out, expected)


def test_final_norm_present_by_default_only_for_pre_ln() -> None:
    pre = Stack(tiny(norm_position="pre"), 1, cross=False)
    post = Stack(tiny(norm_position="post"), 1, cross=False)
    assert sum(p.numel() for p in pre.final_norm.parameters()) == 64
    assert isinstance(post.final_norm, torch.nn.Identity)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_residual_dropout_only_in_training(norm_position: str) -> None:
    block = Block(tiny(dropout=0.5, norm_position=norm_position))
    x = torch.randn(2, 6, 32)
    ctx = context(x, is_causal=True)
    block.eval()
    torch.testing.assert_close(on_rows(block, x, ctx), on_rows(block, x, ctx))
    block.train()
    assert not torch.allclose(on_rows(block, x, ctx), on_rows(block, x, ctx))


def test_dropout_off_leaves_no_dropout_call_in_the_model() -> None:
    """dropout=0 builds no dropout modules (each would be a call per step for nothing); the
    embedding's dropout works like the residual ones when it is on."""
    from scalelab.model import Transformer

    off = Transformer(tiny(dropout=0.0))
    assert not any(isinstance(m, (torch.nn.Dropout, torch.nn.Identity)) for m in off.modules()
                   if m is not getattr(off.decoder, "final_norm", None))
    on = Transformer(tiny(dropout=0.5, n_layers=1))
    assert isinstance(on.drop, torch.nn.Dropout)
    x = torch.randint(0, on.cfg.vocab_size, (2, 6))
    pos = torch.arange(6)
    on.train()
    assert not torch.allclose(on._embed(x, pos), on._embed(x, pos))
    on.eval()
    torch.testing.assert_close(on._embed(x, pos), on._embed(x, pos))
