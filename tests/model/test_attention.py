"""Attention: both implementations (sdpa, math) equal attention written out by hand and each
other, in outputs and gradients; GQA/MQA semantics; masks; the fused q/k/v projection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scalelab.model import Transformer
from scalelab.model.attention import (
    AttnContext,
    CrossAttention,
    KVCache,
    SelfAttention,
    math_attention,
    sdpa_attention,
)
from scalelab.model.transformer import build_context

from .helpers import context, on_rows, project, ref_attention, tiny

IMPLS = ["sdpa", "math"]


@pytest.mark.parametrize("attention", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_matches_hand_written(attention: str, n_kv_heads: int, causal: bool) -> None:
    attn = SelfAttention(tiny(n_kv_heads=n_kv_heads, attention=attention)).eval()
    x = torch.randn(2, 7, 32)
    out = on_rows(attn, x, context(x, is_causal=causal))
    torch.testing.assert_close(out, ref_attention(attn, x, causal=causal))


def test_qkv_is_one_linear_saved_under_its_own_name() -> None:
    mqa = SelfAttention(tiny(n_kv_heads=1))
    assert isinstance(mqa.qkv_proj, torch.nn.Linear)
    assert mqa.qkv_proj.weight.shape == (32 + 8 + 8, 32)  # one head of dim 8 for k and for v
    assert list(mqa.state_dict()) == ["qkv_proj.weight", "qkv_proj.bias", "o_proj.weight", "o_proj.bias"]
    other = SelfAttention(tiny(n_kv_heads=1))
    other.load_state_dict(mqa.state_dict())
    assert torch.equal(other.qkv_proj.weight, mqa.qkv_proj.weight)
    with pytest.raises(RuntimeError, match=r"size mismatch for qkv_proj\.weight"):
        SelfAttention(tiny()).load_state_dict(mqa.state_dict())


@pytest.mark.parametrize("attention", IMPLS)
@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_gqa_equals_mha_with_kv_weights_duplicated(attention: str, n_kv_heads: int) -> None:
    """GQA shares each K/V head among n_heads/n_kv_heads query heads: an MHA whose K/V
    weights are the GQA ones repeated per group gives the same output."""
    gqa = SelfAttention(tiny(n_kv_heads=n_kv_heads, attention=attention))
    mha = SelfAttention(tiny(attention=attention))
    group, hd = 4 // n_kv_heads, 8
    state = gqa.state_dict()
    for suffix in ("weight", "bias"):
        q, k, v = state[f"qkv_proj.{suffix}"].split(gqa.splits)
        k, v = (t.view(n_kv_heads, hd, *t.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)
                for t in (k, v))
        state[f"qkv_proj.{suffix}"] = torch.cat([q, k, v])
    mha.load_state_dict(state)
    x = torch.randn(2, 6, 32)
    ctx = context(x, is_causal=True)
    torch.testing.assert_close(on_rows(gqa, x, ctx), on_rows(mha, x, ctx))


@pytest.mark.parametrize("attention", IMPLS)
def test_key_padding_mask_is_respected(attention: str) -> None:
    attn = SelfAttention(tiny(attention=attention)).eval()
    x = torch.randn(2, 6, 32)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    ctx = build_context(2, torch.arange(6), 6, causal=False, key_keep=keep, bias=None)
    torch.testing.assert_close(on_rows(attn, x, ctx), ref_attention(attn, x, key_keep=keep))
    # changing padded tokens does not change the real positions' outputs
    x2 = x.clone()
    x2[1, 4:] = torch.randn(2, 32)
    torch.testing.assert_close(on_rows(attn, x2, ctx)[1, :4], on_rows(attn, x, ctx)[1, :4])


@pytest.mark.parametrize("attention", IMPLS)
def test_cross_attention_matches_hand_written_and_caches_memory(attention: str) -> None:
    attn = CrossAttention(tiny(n_kv_heads=2, attention=attention)).eval()
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


@pytest.mark.parametrize("attention", IMPLS)
def test_alibi_bias_enters_the_scores(attention: str) -> None:
    attn = SelfAttention(tiny(attention=attention)).eval()
    x = torch.randn(1, 5, 32)
    bias = torch.randn(4, 5, 5)
    ctx = build_context(1, torch.arange(5), 5, causal=True, key_keep=None, bias=bias)
    out = on_rows(attn, x, ctx)
    # same computation by hand: scores + bias, causal
    q, k, v = (project(attn, name, x).view(1, 5, 4, 8).transpose(1, 2) for name in "qkv")
    s = q @ k.transpose(-1, -2) / 8**0.5 + bias
    s = s.masked_fill(~torch.tril(torch.ones(5, 5, dtype=torch.bool)), float("-inf"))
    y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(1, 5, 32)
    torch.testing.assert_close(out, attn.o_proj(y))


# --- sdpa and math: the same function ---------------------------------------------------------
def _qkv(h: int, hkv: int, tq: int, tk: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(2, n, t, 8, requires_grad=True) for n, t in ((h, tq), (hkv, tk), (hkv, tk)))


def _padding_and_alibi(tq: int, tk: int) -> torch.Tensor:
    keep = torch.ones(2, tk, dtype=torch.bool)
    keep[1, -2:] = False
    ctx = build_context(2, torch.arange(tk - tq, tk), tk, causal=True, key_keep=keep,
                        bias=torch.randn(4, tq, tk, generator=torch.Generator().manual_seed(0)))
    assert ctx.mask is not None
    return ctx.mask


CASES = {  # (heads, K/V heads, queries, keys, mask, is_causal)
    "causal": (4, 4, 6, 6, None, True),
    "bidirectional": (4, 4, 6, 6, None, False),
    "GQA causal": (4, 2, 6, 6, None, True),
    "MQA causal": (4, 1, 6, 6, None, True),
    "padding + ALiBi, decoding past keys": (4, 2, 3, 7, _padding_and_alibi(3, 7), False),
    "cross-attention, padded memory": (4, 4, 3, 9, build_context(
        2, torch.arange(3), 9, False, torch.tensor([[True] * 9, [True] * 5 + [False] * 4]), None).mask, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_and_math_give_the_same_outputs_and_gradients(case: str) -> None:
    h, hkv, tq, tk, mask, causal = CASES[case]
    q, k, v = _qkv(h, hkv, tq, tk)
    outs, grads = [], []
    for fn in (sdpa_attention, math_attention):
        y = fn(q, k, v, mask, causal, 0.0, 8 ** -0.5)
        assert y.shape == (2, h, tq, 8)
        outs.append(y)
        grads.append(torch.autograd.grad((y * torch.linspace(-1, 1, 8)).sum(), (q, k, v)))
    torch.testing.assert_close(outs[0], outs[1])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("arch, extra", [
    ("decoder", dict(position="rope", n_kv_heads=2, mlp="swiglu", norm="rmsnorm")),
    ("decoder", dict(position="alibi", n_kv_heads=1)),
    ("encoder", dict(mlm_head=True)),
    ("encoder_decoder", dict(n_kv_heads=2)),
])
def test_a_model_trains_the_same_with_either_attention(arch: str, extra: dict) -> None:
    """Same weights, same batch: the same logits, loss gradients and cached decoding."""
    models = []
    for attention in IMPLS:
        torch.manual_seed(0)
        models.append(Transformer(tiny(arch=arch, attention=attention, **extra)))
    x = torch.randint(0, 37, (2, 9))
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[1, -3:] = False
    kwargs = {"encoder": dict(attention_mask=keep), "encoder_decoder": dict(src_ids=x.flip(1)),
              "decoder": {}}[arch]
    logits, grads = [], []
    for model in models:
        out = model(x, **kwargs)
        loss = F.cross_entropy(out.flatten(0, 1), x.flatten())
        logits.append(out)
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    torch.testing.assert_close(logits[0], logits[1])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
    if arch != "encoder":
        src = kwargs.get("src_ids")
        sdpa, math = (m.generate(x[:, :4], 5, temperature=0, src_ids=src) for m in models)
        assert torch.equal(sdpa, math)


def test_the_choice_changes_no_parameter_or_flop() -> None:
    sdpa, math = tiny(attention="sdpa"), tiny(attention="math")
    assert sdpa.n_params() == math.n_params() == sum(p.numel() for p in Transformer(math).parameters())
    assert sdpa.flops_per_token() == math.flops_per_token()
    assert list(Transformer(sdpa).state_dict()) == list(Transformer(math).state_dict())


@pytest.mark.parametrize("attention", IMPLS)
def test_dropout_applies_in_training_only(attention: str) -> None:
    attn = SelfAttention(tiny(attention=attention, dropout=0.5))
    x = torch.randn(2, 6, 32)
    ctx = context(x, is_causal=True)
    torch.manual_seed(1)
    train = on_rows(attn, x, ctx)
    assert not torch.allclose(train, on_rows(attn.eval(), x, ctx))
    torch.testing.assert_close(on_rows(attn, x, ctx), ref_attention(attn, x, causal=True))


def test_an_unknown_attention_is_one_line_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"^ModelConfig\.attention='flash' is unknown; "
                                         r"choose one of sdpa, math$"):
        tiny(attention="flash")


# --- bf16 on a CPU ----------------------------------------------------------------------------
def _bf16_attention_by_hand(attn: SelfAttention, x: torch.Tensor, ctx: AttnContext,
                            sdpa_dtype: torch.dtype) -> torch.Tensor:
    """The module's attention under CPU bf16 autocast with SDPA run in ``sdpa_dtype``."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attn.heads(x.flatten(0, 1), ctx)
        mask = None if ctx.mask is None else ctx.mask.to(sdpa_dtype)
        with torch.autocast("cpu", enabled=False):
            y = F.scaled_dot_product_attention(q.to(sdpa_dtype), k.to(sdpa_dtype), v.to(sdpa_dtype),
                                               attn_mask=mask, is_causal=ctx.is_causal and mask is None,
                                               enable_gqa=attn.n_kv_heads != attn.n_heads,
                                               scale=attn.scale)
        b, _, t, _ = y.shape
        return attn.o_proj(y.to(torch.bfloat16).transpose(1, 2).reshape(b * t, -1)).view(x.shape)


@pytest.mark.parametrize("n_kv_heads, padded", [(4, False), (2, True)])
def test_bf16_training_attention_runs_sdpa_in_fp32_on_cpu(n_kv_heads: int, padded: bool) -> None:
    """torch's CPU flash-attention backward is much slower in bf16 than in fp32, so a bf16
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


def test_bf16_math_attention_is_close_to_fp32() -> None:
    attn = SelfAttention(tiny(attention="math"))
    x = torch.randn(2, 6, 32)
    ctx = context(x, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = on_rows(attn, x, ctx)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), on_rows(attn, x, ctx), rtol=0.05, atol=0.02)
