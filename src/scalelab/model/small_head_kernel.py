"""The small-head attention kernel (small_head_attention.c) as an autograd Function.

``attention`` takes what ``small_head_attention.attention`` takes (q [B, H, Tq, hd], k and v
[B, Hkv, Tk, hd] as strided views, an additive float mask broadcastable to [B, H, Tq, Tk] or
is_causal, a scale) and returns SDPA's result to float rounding, in fp32 on a CPU. The kernel
reads every input through its strides (the model's q, k and v are views of one projection) and
writes y as [B, Tq, H, hd] in memory, the layout the output projection reads, so neither side
copies. It saves the log-sum-exp per query for backward, not the probabilities.
"""

from __future__ import annotations

import ctypes

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from . import cpu_kernels

KERNEL = cpu_kernels.Kernel("small_head_attention", "attention (small heads)",
                            "SCALELAB_FAST_ATTENTION",
                            (("sha_forward", ctypes.c_int), ("sha_backward", ctypes.c_int)),
                            fallback="SDPA or the batched-matmul path runs, whichever times faster")
MAX_HEAD_DIM, MAX_KEYS = 16, 256  # the C file's MAX_HD and MAX_T


def library() -> ctypes.CDLL | None:
    """The built kernel, or None (the caller's other path runs) with one warning saying why."""
    return cpu_kernels.load(KERNEL)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              is_causal: bool, scale: float | None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, [B, H, Tq, hd] (strided as [B, Tq, H, hd])."""
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return _KernelAttention.apply(q, k, v, mask, is_causal and mask is None,
                                  q.shape[-1] ** -0.5 if scale is None else scale)


def _dims(q: torch.Tensor, k: torch.Tensor, *tensors: torch.Tensor | None) -> ctypes.Array:
    """B, H, Hkv, Tq, Tk, hd, then 4 strides per tensor (zeros for an absent mask)."""
    b, h, tq, hd = q.shape
    strides = [s for t in tensors for s in (t.stride() if t is not None else (0, 0, 0, 0))]
    values = (b, h, k.shape[1], tq, k.shape[2], hd, *strides)
    return (ctypes.c_int64 * len(values))(*values)


def _ptr(t: torch.Tensor | None) -> ctypes.c_void_p | None:
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _heads_last(b: int, h: int, t: int, hd: int, like: torch.Tensor) -> torch.Tensor:
    """[B, H, T, hd] laid out as [B, T, H, hd]."""
    return like.new_empty(b, t, h, hd).transpose(1, 2)


def _check(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"small-head attention kernel ({what}): sizes beyond its limits "
                           f"(head_dim <= {MAX_HEAD_DIM}, keys <= {MAX_KEYS}) or out of memory")


class _KernelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None, causal: bool, scale: float) -> torch.Tensor:
        b, h, tq, hd = q.shape
        y = _heads_last(b, h, tq, hd, q)
        lse = q.new_empty(b, h, tq)
        _check(library().sha_forward(  # type: ignore[union-attr]
            _ptr(q), _ptr(k), _ptr(v), _ptr(mask), _ptr(y), _ptr(lse), _dims(q, k, q, k, v, mask, y),
            ctypes.c_int(causal), ctypes.c_float(scale), ctypes.c_int(torch.get_num_threads())),
            "forward")
        ctx.save_for_backward(q, k, v, y, lse, mask)
        ctx.causal, ctx.scale = causal, scale  # type: ignore[attr-defined]
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, y, lse, mask = ctx.saved_tensors  # type: ignore[attr-defined]
        b, h, tq, hd = q.shape
        hkv, tk = k.shape[1], k.shape[2]
        dq, dk, dv = (_heads_last(b, n, t, hd, q) for n, t in ((h, tq), (hkv, tk), (hkv, tk)))
        _check(library().sha_backward(  # type: ignore[union-attr]
            _ptr(dy), _ptr(q), _ptr(k), _ptr(v), _ptr(y), _ptr(lse), _ptr(mask), _ptr(dq), _ptr(dk),
            _ptr(dv), _dims(q, k, dy, q, k, v, y, mask, dq, dk, dv), ctypes.c_int(ctx.causal),  # type: ignore[attr-defined]
            ctypes.c_float(ctx.scale), ctypes.c_int(torch.get_num_threads())),  # type: ignore[attr-defined]
            "backward")
        return dq, dk, dv, None, None, None
