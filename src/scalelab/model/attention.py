"""Multi-head attention via F.scaled_dot_product_attention (self and cross, MHA/GQA/MQA).

K and V have ``n_kv_heads`` heads. With fewer K/V heads than query heads (GQA, or MQA
with 1), SDPA's ``enable_gqa`` lets each K/V head serve n_heads/n_kv_heads query heads;
no weights are copied. Masks arrive precomputed in an AttnContext so attention has no
knowledge of positions or architecture beyond "rotate q/k" and "add this mask".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import fused_layout, small_head_attention
from .config import ModelConfig
from .positions import Rotary, _identity


@dataclass
class AttnContext:
    """What one attention call needs besides its input, built once per forward per stack."""

    rotary: Rotary = _identity  # applied to q and the new k (RoPE); identity otherwise
    # additive float mask broadcastable to [B, H, Tq, Tk]: 0 / bias where allowed, a very
    # negative number where not (padding, future). None: no mask.
    mask: torch.Tensor | None = None
    is_causal: bool = False  # SDPA's fast causal path; only used when mask is None


class KVCache:
    """Keys and values of one attention layer: past positions (self) or the encoder (cross)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # [B, n_kv_heads, S, head_dim]
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        d = cfg.d_model
        self._make_projections(cfg)  # before o_proj: parameters in the order q, k, v, o
        self.o_proj = nn.Linear(d, d, bias=cfg.bias)
        self.o_proj.residual_out = True  # type: ignore[assignment]  # scaled at init (GPT-2)
        self.dropout = cfg.dropout
        self.small_heads = small_head_attention.may_apply(cfg.head_dim, cfg.dropout)
        # µP: 1/sqrt(head_dim * m), i.e. sqrt(base head_dim) / head_dim: the 1/head_dim law
        # that keeps attention logits O(1) as heads widen, equal to SDPA's default 1/sqrt(hd)
        # (None) at the base width, so an lr tuned there means the same model.
        m = cfg.width_multiplier
        self.scale = 1.0 / math.sqrt(cfg.head_dim * m) if cfg.parametrization == "mup" else None

    def _make_projections(self, cfg: ModelConfig) -> None:
        raise NotImplementedError

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = t.shape
        return t.view(b, s, n, self.head_dim).transpose(1, 2)  # [B, n, S, hd]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: AttnContext) -> torch.Tensor:
        mask = None if ctx.mask is None else ctx.mask.to(q.dtype)
        dropout = self.dropout if self.training else 0.0
        causal = ctx.is_causal and mask is None
        if (self.small_heads and small_head_attention.applies(q, k, dropout)  # CPU training
                and small_head_attention.pays(q, k, mask, causal)):  # timed faster here
            y = small_head_attention.attention(q, k, v, mask, causal, self.scale)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                enable_gqa=self.n_kv_heads != self.n_heads, scale=self.scale)
        b, _, t, _ = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class SelfAttention(_Attention):
    """Causal (decoder) or bidirectional (encoder); which one is decided by ctx's mask.

    q, k and v come from one (d + 2 kv) x d projection, ``qkv_proj``, as in a hand-written
    GPT's ``c_attn``: one GEMM and one parameter instead of three (fewer tensors for the
    optimizer and no weight concatenation per step). ``state_dict`` still holds ``q_proj``,
    ``k_proj`` and ``v_proj`` (:mod:`.fused_layout`), so checkpoints, exports and HF interop
    keep their layout and load either way.
    """

    def _make_projections(self, cfg: ModelConfig) -> None:
        kv = cfg.kv_heads * cfg.head_dim
        self.splits = (cfg.d_model, kv, kv)  # rows of q, k and v in qkv_proj
        self.qkv_proj = nn.Linear(cfg.d_model, sum(self.splits), bias=cfg.bias)
        fused_layout.register(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"), self.splits)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v projections of x, each [B, T, features] (strided views of one GEMM)."""
        return self.qkv_proj(x).split(self.splits, dim=-1)

    def forward(self, x: torch.Tensor, ctx: AttnContext,
                cache: KVCache | None = None) -> torch.Tensor:
        q, k, v = self.qkv(x)
        q = ctx.rotary(self._heads(q, self.n_heads))
        k = ctx.rotary(self._heads(k, self.n_kv_heads))
        v = self._heads(v, self.n_kv_heads)
        if cache is not None:  # append the new (already rotated) keys to the past ones
            if cache.k is not None:
                k = torch.cat([cache.k, k], dim=2)
                v = torch.cat([cache.v, v], dim=2)
            cache.k, cache.v = k, v
        return self._attend(q, k, v, ctx)


class CrossAttention(_Attention):
    """Decoder queries attend to the encoder output ``memory`` (no positions applied)."""

    def _make_projections(self, cfg: ModelConfig) -> None:
        d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(d, d, bias=cfg.bias)
        self.k_proj = nn.Linear(d, kv, bias=cfg.bias)
        self.v_proj = nn.Linear(d, kv, bias=cfg.bias)

    def forward(self, x: torch.Tensor, ctx: AttnContext, memory: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        q = self._heads(self.q_proj(x), self.n_heads)
        if cache is not None and cache.k is not None:  # encoder K/V computed once per sequence
            k, v = cache.k, cache.v
        else:
            k = self._heads(self.k_proj(memory), self.n_kv_heads)
            v = self._heads(self.v_proj(memory), self.n_kv_heads)
            if cache is not None:
                cache.k, cache.v = k, v
        return self._attend(q, k, v, ctx)
