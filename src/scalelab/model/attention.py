"""Multi-head attention (self and cross, MHA/GQA/MQA) over rows [B * T, d].

K and V have ``n_kv_heads`` heads; with fewer than the query heads (GQA, or MQA with 1) each
K/V head serves n_heads / n_kv_heads query heads. Masks arrive precomputed in an AttnContext,
so attention knows nothing of positions beyond "rotate q and k" and "add this mask".

``model.attention`` picks how softmax(q k^T * scale + mask) v is computed, once per layer:
  sdpa  ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels where available)
  math  the same formula in plain torch ops: matmul, softmax, matmul. Readable, and a way
        around a backend whose SDPA kernels are slow at some shape; which is faster depends on
        the device and the torch build, so it is a setting, never guessed at run time.
Both give the same result to float rounding (tests/model/test_attention.py).

Activations travel as rows, one per token, so each Linear is one GEMM on its input as it is;
attention is the one place that needs B and T back, and the AttnContext carries them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ATTENTIONS, ModelConfig
from .positions import Rotary, _identity
from .variants import check_registry


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
    is_causal: bool = False  # causal with Tq == Tk and no mask (SDPA's fast path)


class KVCache:
    """Keys and values of one attention layer: past positions (self) or the encoder (cross)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # [B, n_kv_heads, S, head_dim]
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


# q [B, H, Tq, hd], k and v [B, Hkv, Tk, hd], mask, is_causal, dropout, scale -> [B, H, Tq, hd]
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool,
                        float, float], torch.Tensor]
_REDUCED = (torch.bfloat16, torch.float16)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   is_causal: bool, dropout: float, scale: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention``. A bf16/fp16 CPU forward that will be differentiated
    runs it in fp32: torch's CPU flash-attention backward is several times slower in bf16 than
    in fp32, which would make bf16 training slower than fp32 training. Autocast would cast the
    inputs straight back, so it is off for the call."""
    gqa = k.shape[1] != q.shape[1]
    if q.dtype in _REDUCED and q.device.type == "cpu" and q.requires_grad:
        with torch.autocast("cpu", enabled=False):
            y = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), attn_mask=None if mask is None else mask.float(),
                dropout_p=dropout, is_causal=is_causal, enable_gqa=gqa, scale=scale)
        return y.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None else mask.to(q.dtype), dropout_p=dropout,
        is_causal=is_causal, enable_gqa=gqa, scale=scale)


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                   is_causal: bool, dropout: float, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v in plain torch ops (the textbook formula)."""
    if k.shape[1] != q.shape[1]:  # GQA: query head i reads K/V head i // (H / Hkv)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores + mask
    elif is_causal:  # query i sees keys 0..i
        future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(v.dtype)
    if dropout:
        p = F.dropout(p, dropout)
    return p @ v


ATTENTION_FUNCTIONS: dict[str, AttentionFn] = {"sdpa": sdpa_attention, "math": math_attention}
check_registry("attention", ATTENTION_FUNCTIONS, ATTENTIONS)


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self._make_projections(cfg)  # before o_proj: parameters in the order q, k, v, o
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.o_proj.residual_out = True  # type: ignore[assignment]  # scaled at init (GPT-2)
        self.dropout = cfg.dropout
        self.attention = ATTENTION_FUNCTIONS[cfg.attention]
        # 1/sqrt(head_dim); under µP the 1/head_dim law that keeps the logits O(1) as heads
        # widen (ModelConfig.attn_score_scale), equal to the standard scale at the base width.
        self.scale = cfg.attn_score_scale

    def _make_projections(self, cfg: ModelConfig) -> None:
        raise NotImplementedError

    def _heads(self, t: torch.Tensor, b: int, s: int, n: int) -> torch.Tensor:
        """Rows [B * S, n * hd] -> [B, n, S, hd] (a view)."""
        return t.view(b, s, n, self.head_dim).transpose(1, 2)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                ctx: AttnContext) -> torch.Tensor:
        dropout = self.dropout if self.training else 0.0
        y = self.attention(q, k, v, ctx.mask, ctx.is_causal and ctx.mask is None, dropout, self.scale)
        b, _, t, _ = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(b * t, self.n_heads * self.head_dim))


class SelfAttention(_Attention):
    """Causal (decoder) or bidirectional (encoder); which one is decided by ctx's mask.

    q, k and v come from one (d + 2 kv) x d Linear, ``qkv_proj`` (GPT-2's ``c_attn``): one GEMM
    instead of three. It is saved under that name; the Hugging Face export splits it where the
    target format keeps q, k and v apart.
    """

    def _make_projections(self, cfg: ModelConfig) -> None:
        kv = cfg.kv_heads * cfg.head_dim
        self.splits = (cfg.d_model, kv, kv)  # rows of q, k and v in qkv_proj
        self.qkv_proj = nn.Linear(cfg.d_model, sum(self.splits), bias=cfg.bias)

    def heads(self, x: torch.Tensor, ctx: AttnContext) -> tuple[torch.Tensor, ...]:
        """q, k, v of the rows x [B * T, d], each [B, heads, T, head_dim]; q and k rotated."""
        b, t = ctx.batch, ctx.q_len
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
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
