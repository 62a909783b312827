"""Position encodings as pictures: the sinusoidal table, PE(p).PE(q) (a function of p - q),
the same similarity for a learned table, and RoPE's relative phase."""

from __future__ import annotations

from pathlib import Path

import torch

from scalelab.model.positions import apply_rope, rope_cos_sin, sinusoidal_table


def rope_relative_scores(n_pos: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """<R_p x, R_q x> for one fixed x: [n_pos, n_pos], constant along diagonals (depends on p-q)."""
    x = torch.ones(1, head_dim) / head_dim ** 0.5
    pos = torch.arange(n_pos)
    cos, sin = rope_cos_sin(pos, head_dim, base)
    rot = apply_rope(x.expand(n_pos, head_dim), cos, sin)
    return rot @ rot.T


def cosine_similarity(table: torch.Tensor) -> torch.Tensor:
    t = torch.nn.functional.normalize(table.float(), dim=-1)
    return t @ t.T


def plot_positions(path: Path, n_pos: int = 64, d_model: int = 128, head_dim: int = 32,
                   learned: torch.Tensor | None = None, rope_base: float = 10000.0,
                   run_scores: torch.Tensor | None = None, title: str = "") -> Path:
    """The sinusoidal table and its similarity, RoPE's relative phase for ``head_dim`` and
    ``rope_base``, and a run's own geometry: the cosine similarity of its ``learned`` table or
    ``run_scores`` (its first layer's q.k by position, viz.attention_maps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pe = sinusoidal_table(torch.arange(n_pos), d_model)
    panels = [
        ("sinusoidal table PE[p, i]", pe.T, "position p", "dimension i", "RdBu_r"),
        ("sinusoidal PE(p)·PE(q)", pe @ pe.T, "position q", "position p", "viridis"),
        (f"RoPE <R_p x, R_q x> (head_dim {head_dim}, base {rope_base:g})",
         rope_relative_scores(n_pos, head_dim, rope_base), "position q", "position p", "viridis"),
    ]
    if learned is not None:
        n = min(n_pos, learned.shape[0])
        panels.append(("this run's learned positions: cosine(P[p], P[q])",
                       cosine_similarity(learned[:n]), "position q", "position p", "viridis"))
    if run_scores is not None:
        panels.append(("this run's layer 0: q_p·k_q, one token\nrepeated (mean over heads)",
                       run_scores.float(), "key position q", "query position p", "RdBu_r"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2))
    for ax, (name, m, xl, yl, cmap) in zip(axes, panels, strict=True):
        im = ax.imshow(m.numpy(), cmap=cmap, aspect="auto", origin="upper")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        fig.colorbar(im, ax=ax, fraction=0.046)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
