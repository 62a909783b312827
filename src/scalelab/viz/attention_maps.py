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
def attention_weights(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """[layers, heads, T, T] attention probabilities of the self-attention layers for ids [1, T]."""
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
    maps = []
    for attn, x, ctx in captured:
        q, k, _ = attn.heads(x, ctx)
        k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # GQA/MQA, as SDPA
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(attn.head_dim)
        t = scores.shape[-1]
        if ctx.mask is not None:
            scores = scores + ctx.mask.float()
        elif ctx.is_causal:
            future = torch.ones(t, t, dtype=torch.bool, device=scores.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        maps.append(scores.softmax(-1)[0])
    return torch.stack(maps)


def plot_attention_grid(weights: torch.Tensor, tokens: list[str], path: Path,
                        title: str = "") -> Path:
    """PNG grid: one row per layer, one column per head, tokens on both axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers, n_heads, t, _ = weights.shape
    size = max(2.4, 0.2 * t)
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(size * n_heads, size * n_layers),
                             squeeze=False)
    labels = ["·" if s == " " else repr(s)[1:-1] for s in tokens]  # a visible space
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            ax.imshow(weights[layer, head].cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} head {head}", fontsize=9)
            ax.set_xticks(range(t), labels, rotation=90, fontsize=8)
            ax.set_yticks(range(t), labels, fontsize=8)
            ax.set_xlabel("key", fontsize=8)
            if head == 0:
                ax.set_ylabel("query", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
