"""Attention for small heads on a CPU: softmax(q k^T * scale + mask) v by scalelab's kernel
(small_head_kernel.py), else as batched matmuls with the backward written out.

Why: a CPU sweep point (head_dim 4 or 8, 64 positions, 1 thread a run) spends about a quarter of
its step in torch's CPU flash-attention kernel, made for wide heads. scalelab's C kernel puts
16 queries on the vector lanes and runs forward + backward 1.3-1.8x faster than it at head_dim
4, 1.15-1.4x at 8, with 1 or 2 threads, on a 2-core AMX Xeon (docs/performance.md, "a small-head
attention kernel"); built for AVX2 (8 lanes, SCALELAB_KERNEL_ARCH=x86-64-v3) 1.5-1.7x at
head_dim 4 and 1.0-1.1x at 8 on the same host. Where the kernel cannot be built, the
batched-matmul path runs: on a 2-core AMD EPYC (Zen 4) it was ~1.5x faster than flash's
backward, mostly thanks to one detail: a bmm whose output has head_dim columns runs ~4x slower
than its transpose, so every product that ends in head_dim columns (p v forward; dv, dq, dk
backward) is computed transposed, (v^T p^T)^T, and handed on as a strided view.

Whether either pays depends on the CPU: the batched-matmul path made a sweep point's step
1.04-1.09x faster on that EPYC and 1.21x slower on the Xeon. So it is never assumed: where a
path may apply (training, head_dim <= 8, fp32; ``applies``), the first forward of each shape
times it against SDPA on fresh tensors of that shape and keeps it only where it is >= 5 %
faster (``pays``).

The batched-matmul path materializes the probabilities [B*H, Tq, Tk] for backward (the kernel
keeps a log-sum-exp per query), which is why keys are capped at MAX_SEQ. Results equal SDPA's
to float rounding (tests/model/test_small_head_attention.py).
"""

from __future__ import annotations

import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from . import small_head_kernel

MAX_HEAD_DIM = 8  # measured crossover on the EPYC: from 16 on, SDPA is as fast or faster
MAX_SEQ = 256  # keys; bounds the [B*H, Tq, Tk] probabilities kept for backward
# "measure": where the path applies, take it if it times faster at that shape; "on": wherever
# it applies; "off": never (SDPA). Tests and benchmarks compare the paths by setting it.
MODE = "measure"
# False: the batched-matmul path even where the kernel is built (tests compare both with SDPA)
USE_KERNEL = True
MARGIN = 1.05  # the path must be this much faster: near a tie, SDPA (no probabilities kept)
ROUNDS, REPS = 5, 2  # timed rounds (after one warm-up) of REPS forward + backward, per path
log = logging.getLogger(__name__)


def may_apply(head_dim: int, dropout: float) -> bool:
    """Whether a layer of this head size and dropout can ever take the path: decided once, when
    the layer is built, so every other layer skips the per-call tests (inside a forward they
    timed 5.5 us a call, against 1 us in a tight loop)."""
    return head_dim <= MAX_HEAD_DIM and not dropout


def chosen(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
           dropout_p: float) -> bool:
    """Whether this attention call takes the path: it ``applies`` and ``pays``. A shape already
    timed slower here is answered first, from one lookup: on a CPU where SDPA wins, that is every
    call after the first (the tests ``applies`` makes cost ~10 us a call inside a forward)."""
    if MODE == "measure" and _BY_SHAPE.get(_shapes(q, k, mask, is_causal)) is False:
        return False
    return applies(q, k, dropout_p) and pays(q, k, mask, is_causal)


def applies(q: torch.Tensor, k: torch.Tensor, dropout_p: float) -> bool:
    """Whether this path is used: a training forward (the backward is most of the gain) in plain
    fp32 on a CPU, small heads, no dropout, not compiling (inductor makes its own kernel from
    SDPA; tested first, since Dynamo cannot trace torch.get_num_threads inside a compiled block
    region), and for the batched-matmul path one thread (with more, flash parallelizes better;
    the kernel runs on torch's threads)."""
    return (MODE != "off" and not torch.compiler.is_compiling() and q.device.type == "cpu"
            and q.dtype == torch.float32 and q.requires_grad and torch.is_grad_enabled()
            and q.shape[-1] <= MAX_HEAD_DIM and k.shape[-2] <= MAX_SEQ and dropout_p == 0.0
            and (kernel_runs() or torch.get_num_threads() == 1)
            and not torch.is_autocast_enabled("cpu"))


def kernel_runs() -> bool:
    """Whether the path is scalelab's kernel (built here, not turned off), else batched matmuls."""
    return USE_KERNEL and small_head_kernel.library() is not None


_FASTER: dict[tuple[object, ...], bool] = {}  # _shape_class -> this path timed faster
# exact shapes -> their class's answer: one lookup a call instead of building the class key
_BY_SHAPE: dict[tuple[object, ...], bool] = {}


def pays(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> bool:
    """Whether to take the path where it ``applies``: by ``MODE``, and for "measure" whether it
    timed ``MARGIN`` faster than SDPA (once per ``_shape_class`` and process, at the first shape
    met in it). A timed choice can fall either way near the margin, and the paths agree only to
    float rounding: with deterministic algorithms asked for (``trainer.deterministic=true``)
    "measure" takes SDPA."""
    if MODE != "measure" or torch.are_deterministic_algorithms_enabled():
        return MODE == "on"
    shapes = _shapes(q, k, mask, is_causal)
    faster = _BY_SHAPE.get(shapes)
    if faster is None:
        faster = _BY_SHAPE[shapes] = _timed_faster(q, k, mask, is_causal)
    return faster


def _shapes(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
            is_causal: bool) -> tuple[object, ...]:
    return q.shape, k.shape, None if mask is None else mask.shape, is_causal


def _timed_faster(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                  is_causal: bool) -> bool:
    """The answer for this shape's class: timed at the first shape met in it."""
    key = _shape_class(q, k, mask, is_causal)
    faster = _FASTER.get(key)
    if faster is None:
        # In a thread of its own: autograd's grad mode and saved-tensor hooks (activation
        # checkpointing's) are per thread, so the timing's own backward leaves the caller's
        # graph alone; torch's thread count is the process's.
        with ThreadPoolExecutor(1) as pool:
            ratio = pool.submit(_speed_ratio, q, k, mask, is_causal).result()
        faster = _FASTER[key] = ratio >= MARGIN
        # Said once per class in the run's log: which kernel trained, on this CPU, and why.
        log.info("attention, q %s: %s timed %.2fx SDPA's speed here, so %s runs",
                 "x".join(map(str, q.shape)), _path_name(), ratio, "it" if faster else "SDPA")
    return faster


def _path_name() -> str:
    return "scalelab's small-head kernel" if kernel_runs() else "the written-out small-head path"


def _shape_class(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None,
                 is_causal: bool) -> tuple[object, ...]:
    """Shapes that are timed once: batch x heads, queries and keys rounded up to a power of two
    (a seq2seq run meets a new target length every few batches; the ratio moves smoothly with
    size), head_dim, heads per K/V head, which mask dimensions broadcast, causal or not, and
    which path on how many threads."""
    b, h, tq, hd = q.shape
    broadcast = None if mask is None else tuple(d == 1 for d in mask.shape)
    return (_pow2(b * h), _pow2(tq), _pow2(k.shape[2]), hd, h // k.shape[1], broadcast, is_causal,
            kernel_runs(), torch.get_num_threads())


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _speed_ratio(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> float:
    """SDPA's time over this path's for forward + backward at these shapes, on fresh tensors
    (their own generator: the run's random stream is not touched), alternating, medians."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(t.shape, generator=g).requires_grad_() for t in (q, k, k))
    mask = None if mask is None else mask.detach()
    gqa = k.shape[1] != q.shape[1]

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                              enable_gqa=gqa)

    def this_path() -> torch.Tensor:
        return attention(q, k, v, mask, is_causal, None)

    times: dict[object, list[float]] = {sdpa: [], this_path: []}
    for _ in range(ROUNDS + 1):
        for path, seconds in times.items():
            t0 = time.perf_counter()
            for _ in range(REPS):
                path().sum().backward()  # type: ignore[operator]
            seconds.append(time.perf_counter() - t0)
    return statistics.median(times[sdpa][1:]) / statistics.median(times[this_path][1:])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              is_causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA's result for q [B, H, Tq, hd] and k, v [B, Hkv, Tk, hd] (Hkv divides H, as SDPA's
    enable_gqa), an additive float mask broadcastable to [B, H, Tq, Tk], or is_causal (aligned
    top-left, as SDPA's). Returns [B, H, Tq, hd] (a strided view)."""
    if kernel_runs():
        return small_head_kernel.attention(q, k, v, mask, is_causal, scale)
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
