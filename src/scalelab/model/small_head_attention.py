"""Attention for small heads on a CPU: softmax(q k^T * scale + mask) v as batched matmuls, with
its backward written out.

Why: a CPU sweep point (head_dim 4 or 8, 64 positions, 1 thread a run) spends much of its step in
the backward of torch's CPU flash-attention kernel. Written out, that backward is ~1.5x faster,
mostly thanks to one detail: a bmm whose output has head_dim columns runs ~4x slower than its
transpose, so every product that ends in head_dim columns (p v forward; dv, dq, dk backward) is
computed transposed, (v^T p^T)^T, and handed on as a strided view. The forward is no faster than
flash's, which skips the masked half and reads q, k, v in place, so the path is used only where
it was measured to win (docs/performance.md, "Small heads on a CPU"): training, 1 thread,
head_dim <= 8. A sweep point's step: 1.04x (1.00-1.08x over six runs); 2 threads: 0.97-1.00x;
a forward alone (held-out scoring): 0.53x at d=12, which is why no-grad forwards keep SDPA.

The probabilities [B*H, Tq, Tk] are materialized and kept for backward, which is why keys are
capped at MAX_SEQ. Results equal SDPA's to float rounding (tests/model/test_small_head_attention.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

MAX_HEAD_DIM = 8  # measured crossover: from 16 on, SDPA is as fast or faster
MAX_SEQ = 256  # keys; bounds the [B*H, Tq, Tk] probabilities kept for backward
ENABLED = True  # tests and benchmarks compare against SDPA by turning it off


def applies(q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> bool:
    """Whether this path is used: a training forward (its backward is the gain) in plain fp32 on
    one CPU thread (with more, flash parallelizes better), small heads, no dropout, not compiling
    (inductor makes its own kernel from SDPA; tested first, since Dynamo cannot trace
    torch.get_num_threads inside a compiled block region)."""
    return (ENABLED and not torch.compiler.is_compiling() and q.device.type == "cpu"
            and q.dtype == torch.float32 and q.requires_grad and torch.is_grad_enabled()
            and q.shape[-1] <= MAX_HEAD_DIM and k.shape[-2] <= MAX_SEQ and dropout_p == 0.0
            and torch.get_num_threads() == 1 and not torch.is_autocast_enabled("cpu"))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              is_causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA's result for q [B, H, Tq, hd] and k, v [B, Hkv, Tk, hd] (Hkv divides H, as SDPA's
    enable_gqa), an additive float mask broadcastable to [B, H, Tq, Tk], or is_causal (aligned
    top-left, as SDPA's). Returns [B, H, Tq, hd] (a strided view)."""
    b, h, tq, hd = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if hkv != h:  # query head i reads K/V head i // (h / hkv), as SDPA's enable_gqa
        k, v = (t[:, :, None].expand(b, hkv, h // hkv, tk, hd).reshape(b, h, tk, hd) for t in (k, v))
    if mask is not None:
        mask = mask.expand(b, h, tq, tk).reshape(b * h, tq, tk)
    elif is_causal:
        mask = _causal_mask(tq, tk, q.dtype, q.device)
    y = _SmallHeadAttention.apply(q.reshape(b * h, tq, hd), k.reshape(b * h, tk, hd),
                                  v.reshape(b * h, tk, hd), mask,
                                  hd ** -0.5 if scale is None else scale)
    return y.view(b, h, tq, hd)


_CAUSAL: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}


def _causal_mask(tq: int, tk: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[tq, tk]: 0 on and below the diagonal, -inf above (query i sees keys 0..i, so every
    row keeps at least one key)."""
    key = (tq, tk, dtype, device)
    if key not in _CAUSAL:
        _CAUSAL[key] = torch.full((tq, tk), float("-inf"), dtype=dtype, device=device).triu(1)
    return _CAUSAL[key]


class _SmallHeadAttention(torch.autograd.Function):
    """q [N, Tq, hd], k and v [N, Tk, hd], mask None or broadcastable to [N, Tq, Tk]."""

    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, scale: float) -> torch.Tensor:
        kt = k.transpose(1, 2)
        s = torch.bmm(q, kt).mul_(scale) if mask is None else torch.baddbmm(mask, q, kt, alpha=scale)
        p = torch.softmax(s, dim=-1)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale  # type: ignore[attr-defined]
        return torch.bmm(v.transpose(1, 2), p.transpose(1, 2)).transpose(1, 2)  # = p v

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, p = ctx.saved_tensors  # type: ignore[attr-defined]
        scale = ctx.scale  # type: ignore[attr-defined]
        dp = torch.bmm(dy, v.transpose(1, 2))
        dv = torch.bmm(dy.transpose(1, 2), p).transpose(1, 2)  # = p^T dy
        ds = torch._softmax_backward_data(dp, p, -1, p.dtype)  # p * (dp - sum(dp * p))
        dq = torch.bmm(k.transpose(1, 2), ds.transpose(1, 2)).transpose(1, 2).mul_(scale)  # ds k
        dk = torch.bmm(q.transpose(1, 2), ds).transpose(1, 2).mul_(scale)  # ds^T q
        return dq, dk, dv, None, None
