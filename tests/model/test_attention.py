"""Attention: SDPA output equals attention written out by hand; GQA/MQA semantics; masks."""

from __future__ import annotations

import pytest
import torch

from scalelab.model.attention import CrossAttention, KVCache, SelfAttention
from scalelab.model.transformer import build_context

from .helpers import context, on_rows, project, ref_attention, tiny


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_matches_hand_written(n_kv_heads: int, causal: bool) -> None:
    attn = SelfAttention(tiny(n_kv_heads=n_kv_heads)).eval()
    x = torch.randn(2, 7, 32)
    out = on_rows(attn, x, context(x, is_causal=causal))
    torch.testing.assert_close(out, ref_attention(attn, x, causal=causal))


def test_gqa_with_all_heads_is_mha_and_mqa_has_one_kv_head() -> None:
    mha, gqa, mqa = (SelfAttention(tiny(n_kv_heads=k)) for k in (None, 4, 1))
    shape = {name: m.state_dict()[f"{p}_proj.weight"].shape
             for name, m in (("mha", mha), ("gqa", gqa), ("mqa", mqa)) for p in "kv"}
    assert shape["mha"] == shape["gqa"] == (32, 32)
    assert mqa.state_dict()["k_proj.weight"].shape == mqa.state_dict()["v_proj.weight"].shape == (8, 32)
    assert mqa.qkv_proj.weight.shape == (32 + 8 + 8, 32)  # one head of dim 8 for k and for v
    gqa.load_state_dict(mha.state_dict())
    x = torch.randn(2, 5, 32)
    ctx = context(x, is_causal=True)
    torch.testing.assert_close(on_rows(gqa, x, ctx), on_rows(mha, x, ctx))


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_gqa_equals_mha_with_kv_weights_duplicated(n_kv_heads: int) -> None:
    """GQA shares each K/V head among n_heads/n_kv_heads query heads: an MHA whose K/V
    weights are the GQA ones repeated per group gives the same output."""
    gqa = SelfAttention(tiny(n_kv_heads=n_kv_heads))
    mha = SelfAttention(tiny())
    state = gqa.state_dict()
    group, hd = 4 // n_kv_heads, 8
    for name in ("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias"):
        w = state[name]
        state[name] = w.view(n_kv_heads, hd, *w.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)
    mha.load_state_dict(state)
    x = torch.randn(2, 6, 32)
    ctx = context(x, is_causal=True)
    torch.testing.assert_close(on_rows(gqa, x, ctx), on_rows(mha, x, ctx))


def test_key_padding_mask_is_respected() -> None:
    attn = SelfAttention(tiny()).eval()
    x = torch.randn(2, 6, 32)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    ctx = build_context(2, torch.arange(6), 6, causal=False, key_keep=keep, bias=None)
    torch.testing.assert_close(on_rows(attn, x, ctx), ref_attention(attn, x, key_keep=keep))
    # changing padded tokens does not change the real positions' outputs
    x2 = x.clone()
    x2[1, 4:] = torch.randn(2, 32)
    torch.testing.assert_close(on_rows(attn, x2, ctx)[1, :4], on_rows(attn, x, ctx)[1, :4])


def test_cross_attention_matches_hand_written_and_caches_memory() -> None:
    attn = CrossAttention(tiny(n_kv_heads=2)).eval()
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 9, 32)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[0, 6:] = False
    ctx = build_context(2, torch.arange(3), 9, causal=False, key_keep=keep, bias=None)
    expected = ref_attention(attn, x, memory=memory, key_keep=keep)
    torch.testing.assert_close(on_rows(attn, x, ctx, memory=memory), expected)
    cache = KVCache()
    on_rows(attn, x, ctx, memory=memory, cache=cache)
    assert cache.length == 9
    # the second call reuses the cached encoder K/V (memory is ignored)
    torch.testing.assert_close(on_rows(attn, x, ctx, memory=torch.zeros_like(memory), cache=cache),
                               expected)


def test_alibi_bias_enters_the_scores() -> None:
    attn = SelfAttention(tiny()).eval()
    x = torch.randn(1, 5, 32)
    bias = torch.randn(4, 5, 5)
    ctx = build_context(1, torch.arange(5), 5, causal=True, key_keep=None, bias=bias)
    out = on_rows(attn, x, ctx)
    # same computation by hand: scores + bias, causal
    q = project(attn, "q_proj", x).view(1, 5, 4, 8).transpose(1, 2)
    k = project(attn, "k_proj", x).view(1, 5, 4, 8).transpose(1, 2)
    v = project(attn, "v_proj", x).view(1, 5, 4, 8).transpose(1, 2)
    s = q @ k.transpose(-1, -2) / 8**0.5 + bias
    s = s.masked_fill(~torch.tril(torch.ones(5, 5, dtype=torch.bool)), float("-inf"))
    y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(1, 5, 32)
    torch.testing.assert_close(out, attn.o_proj(y))


def _bf16_attention_by_hand(attn: SelfAttention, x: torch.Tensor, ctx: object,
                            sdpa_dtype: torch.dtype) -> torch.Tensor:
    """The module's attention under CPU bf16 autocast with SDPA run in ``sdpa_dtype``."""
    import torch.nn.functional as F

    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attn.heads(x.flatten(0, 1), ctx)
        mask = None if ctx.mask is None else ctx.mask.to(sdpa_dtype)
        with torch.autocast("cpu", enabled=False):
            y = F.scaled_dot_product_attention(q.to(sdpa_dtype), k.to(sdpa_dtype), v.to(sdpa_dtype),
                                               attn_mask=mask, is_causal=ctx.is_causal and mask is None,
                                               enable_gqa=attn.n_kv_heads != attn.n_heads)
        b, _, t, _ = y.shape
        return attn.o_proj(y.to(torch.bfloat16).transpose(1, 2).reshape(b * t, -1)).view(x.shape)


@pytest.mark.parametrize("n_kv_heads, padded", [(4, False), (2, True)])
def test_bf16_training_attention_runs_sdpa_in_fp32_on_cpu(n_kv_heads: int, padded: bool) -> None:
    """torch's CPU flash-attention backward is 4-5x slower in bf16 than in fp32, so a bf16
    training forward computes SDPA in fp32; a forward without gradients keeps bf16 SDPA."""
    attn = SelfAttention(tiny(n_kv_heads=n_kv_heads))
    x = torch.randn(2, 6, 32)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]) if padded else None
    ctx = build_context(2, torch.arange(6), 6, causal=not padded, key_keep=keep, bias=None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = on_rows(attn, x, ctx)
    assert out.dtype == torch.bfloat16
    expected = _bf16_attention_by_hand(attn, x, ctx, torch.float32)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    grads = torch.autograd.grad(out.float().sum(), attn.qkv_proj.weight)
    torch.testing.assert_close(grads, torch.autograd.grad(expected.float().sum(), attn.qkv_proj.weight),
                               rtol=0, atol=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(on_rows(attn, x, ctx), _bf16_attention_by_hand(attn, x, ctx, torch.bfloat16),
                                   rtol=0, atol=0)
