"""Position information, chosen by name (``position: learned | sinusoidal | rope | alibi | none``).

A variant is a Position subclass in POSITION_CLASSES plus its row in variants.POSITIONS
(a learned table or not, a dimension that must be even).

Each variant answers the same three questions, so the model never branches on names:
  embed(x, pos)     add a position signal to the token embeddings (learned, sinusoidal)
  rotary(pos)       a function applied to q and k per head (RoPE), else identity
  bias(q_pos, k_pos) an additive attention bias [H, Tq, Tk] (ALiBi), else None
``pos`` holds absolute positions (offset by the KV cache length while decoding).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .config import ModelConfig
from .variants import POSITIONS, check_registry

Rotary = Callable[[torch.Tensor], torch.Tensor]


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class Position(nn.Module):
    """The interface: no position signal at all unless a subclass adds one."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.max_seq_len = cfg.max_seq_len

    def check_length(self, end: int, what: str = "input", *args: object) -> None:
        """Raise if positions up to ``end`` do not fit; ``what % args`` names the input (formatted
        only then, as logging does: this runs every forward). Only a learned table has a limit."""

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x

    def rotary(self, pos: torch.Tensor) -> Rotary:
        return _identity

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        return None


class NoPosition(Position):
    """No explicit positions (a causal decoder can still infer them; Haviv et al. 2022)."""


class LearnedPosition(Position):
    """A trainable table of max_seq_len vectors (GPT-2, BERT); shared by enc and dec stacks."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.table = nn.Embedding(cfg.max_seq_len, cfg.d_model)

    def check_length(self, end: int, what: str = "input", *args: object) -> None:
        if end > self.max_seq_len:
            raise ValueError(
                f"{what % args} needs positions up to {end}, but the learned position table has "
                f"max_seq_len={self.max_seq_len} rows; crop the sequence to {self.max_seq_len} "
                f"tokens or build the model with a larger model.max_seq_len")

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x + self.table(pos)


def sinusoidal_table(pos: torch.Tensor, d: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p*w_i), PE[p, 2i+1] = cos(p*w_i), w_i = 10000^(-2i/d) (Vaswani et al.)."""
    i = torch.arange(d // 2, device=pos.device, dtype=torch.float32)
    omega = torch.exp(-math.log(10000.0) * 2 * i / d)
    angle = pos.float()[:, None] * omega[None, :]
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)  # interleave sin, cos


class SinusoidalPosition(Position):
    """Fixed sinusoids, computed on the fly (no parameters, no length limit)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.d_model = cfg.d_model

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return x + sinusoidal_table(pos, self.d_model).to(x.dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, head_dim] for theta_i = base^(-2i/head_dim), in the half-split layout."""
    i = torch.arange(head_dim // 2, device=pos.device, dtype=torch.float32)
    theta = base ** (-2 * i / head_dim)
    angle = pos.float()[:, None] * theta[None, :]
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos(), angle.sin()


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate dim pairs (j, j + hd/2) of t [..., T, hd] by the angles (GPT-NeoX/HF layout)."""
    tf = t.float()
    half = tf.shape[-1] // 2
    rotated = torch.cat([-tf[..., half:], tf[..., :half]], dim=-1)
    return (tf * cos + rotated * sin).type_as(t)


class RotaryPosition(Position):
    """RoPE (Su et al. 2021): q and k rotated by position so q.k depends on p - q only."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.head_dim, self.base = cfg.head_dim, cfg.rope_base

    def rotary(self, pos: torch.Tensor) -> Rotary:
        cos, sin = rope_cos_sin(pos, self.head_dim, self.base)
        return lambda t: apply_rope(t, cos, sin)


def alibi_slopes(n_heads: int) -> list[float]:
    """Per-head slopes from the ALiBi paper's official code (Press et al. 2022).

    For a power of two n: 2^(-8/n), 2^(-16/n), ...; otherwise the slopes of the closest
    lower power of two, plus every other slope of the next power of two.
    """

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


class AlibiPosition(Position):
    """Linear biases: score(i, j) += slope_h * (j - i) for keys j <= i.

    Bidirectional attention (encoder) uses the symmetric -slope_h * |j - i|, which equals
    the paper's bias wherever a causal mask lets a key through.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        slopes = torch.tensor(alibi_slopes(cfg.n_heads), dtype=torch.float32)
        self.register_buffer("slopes", slopes, persistent=False)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        dist = (k_pos[None, :] - q_pos[:, None]).abs().float()
        return -self.slopes.to(q_pos.device)[:, None, None] * dist[None]


POSITION_CLASSES: dict[str, type[Position]] = {
    "learned": LearnedPosition,
    "sinusoidal": SinusoidalPosition,
    "rope": RotaryPosition,
    "alibi": AlibiPosition,
    "none": NoPosition,
}
check_registry("position", POSITION_CLASSES, POSITIONS)


def build_position(cfg: ModelConfig) -> Position:
    return POSITION_CLASSES[cfg.position](cfg)
