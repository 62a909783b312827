"""Attention weights without touching the fast path.

The model attends with SDPA, which never materializes softmax(QK^T). Here a forward pre-hook
on every SelfAttention records its input and context, and the weights are recomputed
explicitly from the module's own projections: only this inspection path pays for it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from scalelab.model.attention import AttnContext, SelfAttention


@torch.no_grad()
def _scores(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[torch.Tensor, AttnContext]]:
    """Per self-attention layer: (QK^T / sqrt(d) [B, heads, T, T] before any mask, its context)."""
    captured: list[tuple[SelfAttention, torch.Tensor, AttnContext]] = []

    def hook(module: SelfAttention, args: tuple) -> None:
        captured.append((module, args[0], args[1]))  # (x, ctx)

    handles = [m.register_forward_pre_hook(hook)
               for m in model.modules() if isinstance(m, SelfAttention)]
    try:
        model.eval()(ids)
    finally:
        for h in handles:
            h.remove()
    out = []
    for attn, x, ctx in captured:
        q, k, _ = attn.heads(x, ctx)
        k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # GQA/MQA, as SDPA
        out.append(((q @ k.transpose(-1, -2)).float() / math.sqrt(attn.head_dim), ctx))
    return out


@torch.no_grad()
def attention_weights(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """[layers, heads, T, T] attention probabilities of the self-attention layers for ids [1, T]."""
    maps = []
    for scores, ctx in _scores(model, ids):
        t = scores.shape[-1]
        if ctx.mask is not None:
            scores = scores + ctx.mask.float()
        elif ctx.is_causal:
            future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        maps.append(scores.softmax(-1)[0])
    return torch.stack(maps)


@torch.no_grad()
def first_layer_position_scores(model: torch.nn.Module, n_pos: int, token: int = 0) -> torch.Tensor:
    """[n_pos, n_pos]: the first attention layer's q_p.k_q (mean over heads, no mask) when every
    position holds the same token. The input is then the same at every position, so what varies
    is position alone: for RoPE, the run's trained rotary geometry (a function of p - q)."""
    scores, _ = _scores(model, torch.full((1, n_pos), token, dtype=torch.long))[0]
    return scores[0].mean(0)


def plot_attention_grid(weights: torch.Tensor, tokens: list[str], path: Path,
                        title: str = "", scale: str = "shared") -> Path:
    """PNG grid: one row per layer, one column per head, tokens on both axes. ``scale``:
    "shared" (one colour scale, 0 to the largest weight, one colorbar) or "head" (each head
    from 0 to its own largest weight, a colorbar each: diffuse heads stay readable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if scale not in ("shared", "head"):
        raise ValueError(f"--scale {scale}: choose shared or head")
    n_layers, n_heads, t, _ = weights.shape
    size = max(2.4, 0.2 * t)
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(size * n_heads + 1, size * n_layers + 0.6),
                             squeeze=False, layout="constrained")
    labels = ["·" if s == " " else repr(s)[1:-1] for s in tokens]  # a visible space
    top = float(weights.max())
    image = None
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            w = weights[layer, head].cpu()
            vmax = float(w.max()) if scale == "head" else top
            image = ax.imshow(w.numpy(), cmap="viridis", vmin=0.0, vmax=vmax or 1.0)
            if scale == "head":
                fig.colorbar(image, ax=ax, fraction=0.046)
            ax.set_title(f"layer {layer} head {head}", fontsize=9)
            ax.set_xticks(range(t), labels, rotation=90, fontsize=8)
            ax.set_yticks(range(t), labels, fontsize=8)
            ax.set_xlabel("key", fontsize=8)
            if head == 0:
                ax.set_ylabel("query", fontsize=8)
    if scale == "shared" and image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
