"""Exact parameter count and FLOPs per token of a ModelConfig, without building the model.

Every row comes from the variant tables in variants.py, so a new MLP, norm or position
scheme is counted by its row alone. tests/model/test_accounting.py checks that the sum
equals ``numel()`` of the built model over the full grid of variants.

The N conventions (which parameters count as N) are owned here too: the run params, the
sweep planner and the scaling fits read their names, keys and values from N_CONVENTIONS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .variants import ARCHS, MLPS, NORMS, POSITIONS

if TYPE_CHECKING:
    from .config import ModelConfig


@dataclass(frozen=True)
class Component:
    """One row of the accounting: ``count`` identical instances of ``params`` parameters."""

    name: str
    kind: str  # embedding | position | block | final_norm | head | attention_scores
    params: int  # per instance
    count: int = 1
    # forward FLOPs per token per instance; matmul rows 2*params, the output layer 2*V*d
    fwd_flops: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def total_params(self) -> int:
        return self.params * self.count

    @property
    def total_fwd_flops(self) -> int:
        return self.fwd_flops * self.count


def norm_params(cfg: ModelConfig) -> int:
    return NORMS[cfg.norm].n_params(cfg.d_model, cfg.bias)


def attn_params(cfg: ModelConfig) -> int:
    d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    weights = d * d + 2 * d * kv + d * d  # q, k, v, out projections
    biases = (d + 2 * kv + d) if cfg.bias else 0
    return weights + biases


def mlp_params(cfg: ModelConfig) -> int:
    assert cfg.d_ff is not None
    return MLPS[cfg.mlp].n_params(cfg.d_model, cfg.d_ff, cfg.bias)


def _stack_rows(cfg: ModelConfig, stack: str, n: int, cross: bool) -> list[Component]:
    attn, mlp, norm = attn_params(cfg), mlp_params(cfg), norm_params(cfg)
    t_attn = 4 * cfg.max_seq_len * cfg.d_model  # QK^T + AV forward FLOPs/token per layer
    rows = [Component(f"{stack} block: self-attention", "block", attn, n, 2 * attn),
            Component(f"{stack} block: attention scores", "attention_scores", 0, n, t_attn)]
    if cross:
        rows.append(Component(f"{stack} block: cross-attention", "block", attn, n, 2 * attn))
        rows.append(Component(f"{stack} block: cross-attention scores", "attention_scores",
                              0, n, t_attn))
    rows.append(Component(f"{stack} block: mlp ({cfg.mlp})", "block", mlp, n, 2 * mlp))
    n_norms = 3 if cross else 2
    rows.append(Component(f"{stack} block: norms ({cfg.norm})", "block", n_norms * norm, n,
                          2 * n_norms * norm))
    if cfg.final_norm:
        rows.append(Component(f"{stack} final norm", "final_norm", norm, 1, 2 * norm))
    return rows


def breakdown(cfg: ModelConfig) -> list[Component]:
    """Per-component parameter counts and forward FLOPs/token (see ModelConfig.breakdown)."""
    d, v = cfg.d_model, cfg.vocab_size
    assert v is not None
    rows = [Component("token embedding", "embedding", v * d)]
    table = POSITIONS[cfg.position].n_params(cfg.max_seq_len, d)
    if table:  # one table, shared by encoder and decoder
        rows.append(Component(f"position embedding ({cfg.position})", "embedding", table))
    if cfg.embed_norm:
        rows.append(Component(f"embedding norm ({cfg.norm})", "final_norm", norm_params(cfg), 1,
                              2 * norm_params(cfg)))
    cross = ARCHS[cfg.arch].cross
    for stack, n in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        if n:
            rows += _stack_rows(cfg, stack, n, cross=cross and stack == "decoder")
    if cfg.mlm_head:  # BERT's transform: dense d->d (+ bias), GELU, norm
        transform = d * d + (d if cfg.bias else 0) + norm_params(cfg)
        rows.append(Component("mlm head transform", "block", transform, 1, 2 * transform))
    head = (0 if cfg.tie_embeddings else v * d) + (v if cfg.mlm_head else 0)  # + output bias
    name = "output layer (tied to token embedding)" if cfg.tie_embeddings else "output layer"
    rows.append(Component(name, "head", head, 1, 2 * v * d))
    return rows


@dataclass(frozen=True)
class NConvention:
    """One way to count N: its logged key (an MLflow param and a sweep-table column)."""

    key: str
    count: Callable[[ModelConfig], int]
    doc: str


# The one list of N conventions (sweeps and fits default to "matmul").
N_CONVENTIONS: dict[str, NConvention] = {
    "total": NConvention("n_params", lambda cfg: cfg.n_params(), "every parameter, tied once"),
    "non_embedding": NConvention("n_params_non_embedding",
                                 lambda cfg: cfg.n_params(non_embedding=True),
                                 "without token / position tables and an untied output layer "
                                 "(Kaplan et al. 2020)"),
    "matmul": NConvention("n_params_matmul", lambda cfg: cfg.n_params_matmul(),
                          "non-embedding + the V*d output layer once (PaLM / Chinchilla)"),
}
N_KEYS: dict[str, str] = {name: conv.key for name, conv in N_CONVENTIONS.items()}


def n_counts(cfg: ModelConfig) -> dict[str, int]:
    """``{key: N}`` for every convention: n_params, n_params_non_embedding, n_params_matmul."""
    return {conv.key: conv.count(cfg) for conv in N_CONVENTIONS.values()}
