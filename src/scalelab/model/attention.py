"""Multi-head attention via F.scaled_dot_product_attention (self and cross, MHA/GQA/MQA).

K and V have ``n_kv_heads`` heads. With fewer K/V heads than query heads (GQA, or MQA
with 1), SDPA's ``enable_gqa`` lets each K/V head serve n_heads/n_kv_heads query heads;
no weights are copied. Masks arrive precomputed in an AttnContext so attention has no
knowledge of positions or architecture beyond "rotate q/k" and "add this mask".

Activations arrive as rows, [B * T, d], one per token (the Transformer flattens them once after
the embedding): a Linear then runs one GEMM on its input as it is, where a [B, T, d] input costs
a view before and after the GEMM and a node for each in backward. At a CPU sweep point's size
(d 12, 2 layers) that was ~2.5 % of a training step (docs/performance.md). Attention is the one
place that needs B and T back; the AttnContext carries them.
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

_REDUCED = (torch.bfloat16, torch.float16)  # dtypes whose CPU attention backward runs in fp32


@dataclass
class AttnContext:
    """What one attention call needs besides its input, built once per forward per stack."""

    batch: int  # B of the [B * T, d] rows
    q_len: int  # T: positions of the queries, and of self-attention's new keys
    k_len: int  # positions of the keys: past and new (self-attention), or of the memory (cross)
    rotary: Rotary = _identity  # applied to q and the new k (RoPE); identity otherwise
    # additive float mask broadcastable to [B, H, Tq, Tk]: 0 / bias where allowed, a very
    # negative number where not (padding, future). None: no mask.
    mask: torch.Tensor | None = None
    is_causal: bool = False  # SDPA's fast causal path; only used when mask is None
    # Whether this forward's self-attention takes the CPU small-head path: asked by the first
    # layer that may take it and kept for the others (they see the same shapes, dtype and
    # threads). None: not asked yet. The question cost ~10 us a layer inside a forward.
    small_heads: bool | None = None


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

    def _heads(self, t: torch.Tensor, b: int, s: int, n: int) -> torch.Tensor:
        """Rows [B * S, n * hd] -> [B, n, S, hd] (a view)."""
        return t.view(b, s, n, self.head_dim).transpose(1, 2)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: AttnContext) -> torch.Tensor:
        dropout = self.dropout if self.training else 0.0
        causal = ctx.is_causal and ctx.mask is None
        if q.dtype in _REDUCED and q.device.type == "cpu" and q.requires_grad:
            y = self._sdpa_in_fp32(q, k, v, ctx.mask, dropout, causal)  # takes the fp32 mask as is
        else:  # (the small-head path is fp32 only)
            mask = None if ctx.mask is None else ctx.mask.to(q.dtype)
            if self.small_heads and self._takes_small_heads(q, k, mask, causal, dropout, ctx):
                y = small_head_attention.attention(q, k, v, mask, causal, self.scale)
            else:
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                    enable_gqa=self.n_kv_heads != self.n_heads, scale=self.scale)
        b, _, t, _ = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(b * t, self.n_heads * self.head_dim))

    def _sdpa_in_fp32(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None, dropout: float, causal: bool) -> torch.Tensor:
        """SDPA of bf16/fp16 q, k, v computed in fp32, returned in their dtype.

        torch's CPU flash attention runs its backward 4-5x slower in bf16 than in fp32 (a
        shakespeare_char layer, 2 threads on an AMX Xeon: 4.7 against 1.1 ms forward + backward;
        the forward alone is as fast). Through it bf16 autocast trained at 0.8-0.9x fp32's speed;
        with attention in fp32, at 1.3-1.6x (docs/performance.md, bf16 on CPU). Autocast would
        cast the inputs back to bf16, so it is off for this call."""
        dtype = q.dtype
        with torch.autocast("cpu", enabled=False):
            y = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=None if mask is None else mask.float(),
                dropout_p=dropout, is_causal=causal, enable_gqa=self.n_kv_heads != self.n_heads,
                scale=self.scale)
        return y.to(dtype)

    @staticmethod
    def _takes_small_heads(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                           causal: bool, dropout: float, ctx: AttnContext) -> bool:
        """The stack's answer for this forward (``AttnContext.small_heads``), asked once."""
        choice = ctx.small_heads
        if choice is None:
            choice = small_head_attention.chosen(q, k, mask, causal, dropout)
            if not torch.compiler.is_compiling():  # a traced block region must not write to ctx
                ctx.small_heads = choice
        return choice


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
        """q, k, v projections of the rows x, each [B * T, features] (strided views of one GEMM)."""
        return self.qkv_proj(x).split(self.splits, dim=-1)

    def heads(self, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, ...]:
        """q, k, v of the rows x [B * T, d], each [B, heads, T, head_dim]; q and k rotated."""
        b, t = ctx.batch, ctx.q_len
        q, k, v = self.qkv(x)
        return (ctx.rotary(self._heads(q, b, t, self.n_heads)),
                ctx.rotary(self._heads(k, b, t, self.n_kv_heads)), self._heads(v, b, t, self.n_kv_heads))

    def forward(self, x: torch.Tensor, ctx: AttnContext,
                cache: KVCache | None = None) -> torch.Tensor:
        """x: rows [B * T, d] (ctx.batch x ctx.q_len); returns the same shape."""
        q, k, v = self.heads(x, ctx)
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
        """x: rows [B * T, d]; memory: the encoder's rows [B * S, d] (ctx.k_len is S)."""
        b = ctx.batch
        q = self._heads(self.q_proj(x), b, ctx.q_len, self.n_heads)
        if cache is not None and cache.k is not None:  # encoder K/V computed once per sequence
            k, v = cache.k, cache.v
        else:
            k = self._heads(self.k_proj(memory), b, ctx.k_len, self.n_kv_heads)
            v = self._heads(self.v_proj(memory), b, ctx.k_len, self.n_kv_heads)
            if cache is not None:
                cache.k, cache.v = k, v
        return self._attend(q, k, v, ctx)
