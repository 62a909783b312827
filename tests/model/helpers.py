"""Shared helpers for the model tests: tiny configs so the suite runs in seconds on 2 CPU cores."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from scalelab.model import ModelConfig
from scalelab.model.attention import AttnContext

TINY: dict[str, Any] = dict(vocab_size=37, max_seq_len=16, d_model=32, n_layers=2, n_heads=4)


def tiny(**overrides: Any) -> ModelConfig:
    """A small ModelConfig; any field can be overridden."""
    return ModelConfig(**{**TINY, **overrides})


def context(x: torch.Tensor, k_len: int | None = None, **kw: Any) -> AttnContext:
    """An AttnContext for x [B, T, d] (keys: T, or k_len)."""
    b, t, _ = x.shape
    return AttnContext(b, t, t if k_len is None else k_len, **kw)


def on_rows(layer: torch.nn.Module, x: torch.Tensor, ctx: AttnContext, **kw: Any) -> torch.Tensor:
    """layer(x, ctx) for x [B, T, d] (and a memory [B, S, d]) through the rows [B * T, d] that a
    stack's layers take, reshaped back."""
    if kw.get("memory") is not None:
        kw["memory"] = kw["memory"].flatten(0, 1)
    return layer(x.flatten(0, 1), ctx, **kw).view(x.shape)


def project(attn: torch.nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """x through attention's q, k or v projection (``name``: "q", "k" or "v"): a Linear of its
    own in cross-attention, a slice of the fused ``qkv_proj`` rows in self-attention."""
    if hasattr(attn, "qkv_proj"):
        i = "qkv".index(name)
        start, stop = sum(attn.splits[:i]), sum(attn.splits[:i + 1])
        bias = attn.qkv_proj.bias
        return F.linear(x, attn.qkv_proj.weight[start:stop], None if bias is None else bias[start:stop])
    return getattr(attn, f"{name}_proj")(x)


def ref_attention(attn: torch.nn.Module, x: torch.Tensor, memory: torch.Tensor | None = None,
                  causal: bool = False, key_keep: torch.Tensor | None = None) -> torch.Tensor:
    """Attention written out by hand from a module's weights: softmax(q k^T / sqrt(hd)) v.

    K/V heads are repeated for GQA (query head h uses K/V head h // (n_heads / n_kv_heads)).
    """
    src = x if memory is None else memory
    b, t, d = x.shape
    s = src.shape[1]
    h, kv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q = project(attn, "q", x).view(b, t, h, hd).transpose(1, 2)
    k = project(attn, "k", src).view(b, s, kv, hd).transpose(1, 2).repeat_interleave(h // kv, dim=1)
    v = project(attn, "v", src).view(b, s, kv, hd).transpose(1, 2).repeat_interleave(h // kv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    allowed = torch.ones(t, s, dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    allowed = allowed[None, None].expand(b, 1, t, s)
    if key_keep is not None:
        allowed = allowed & key_keep[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return attn.o_proj(y.transpose(1, 2).reshape(b, t, d))
