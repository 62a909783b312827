"""Position-wise feed-forward layers, chosen by name (``mlp: gelu | relu | swiglu | geglu``).

A variant is a class with an ``act`` hook in MLP_CLASSES plus its shape row in
variants.MLPS (matrices in, default hidden size), which the accounting reads. Every variant
names its output projection ``down`` and marks it ``residual_out`` so the GPT-2 init can
scale it by 1/sqrt(2 * n_layers_total).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .norms import build_norm
from .variants import MLPS, check_registry


class TwoLayerMLP(nn.Module):
    """down(act(up(x))): d -> d_ff -> d (2017 paper, GPT-2, BERT)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.d_ff is not None
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.down.residual_out = True  # type: ignore[assignment]

    def act(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) (Shazeer 2020): a third matrix, so d_ff ~ 8d/3."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.d_ff is not None
        # gate, up, down: this order is the parameter order, and so the seeded init
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.down.residual_out = True  # type: ignore[assignment]

    def act(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class GeluMLP(TwoLayerMLP):
    def act(self, h: torch.Tensor) -> torch.Tensor:
        # tanh approximation, as in GPT-2 / BERT's original code
        return F.gelu(h, approximate="tanh")


class GeluExactMLP(TwoLayerMLP):
    """The exact (erf) GELU: BERT's Hugging Face ``hidden_act="gelu"``; it differs from the
    tanh approximation by < 1e-3."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h)


class ReluMLP(TwoLayerMLP):
    def act(self, h: torch.Tensor) -> torch.Tensor:
        return F.relu(h)


class SwiGLU(GatedMLP):
    """Llama's MLP: silu-gated."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return F.silu(h)


class GeGLU(GatedMLP):
    """GELU-gated (Shazeer 2020; T5 v1.1, Gemma), tanh approximation as in GeluMLP."""

    def act(self, h: torch.Tensor) -> torch.Tensor:
        return F.gelu(h, approximate="tanh")


class MLMTransform(nn.Module):
    """BERT's output transform (cfg.mlm_head): norm(gelu(dense(x))) before the output layer,
    with the MLP's GELU flavour (Hugging Face's BERT uses hidden_act in both places)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.norm = build_norm(cfg)
        self.approximate = "none" if cfg.mlp == "gelu_exact" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(x), approximate=self.approximate))


MLP_CLASSES: dict[str, type[nn.Module]] = {
    "gelu": GeluMLP, "gelu_exact": GeluExactMLP, "relu": ReluMLP, "swiglu": SwiGLU,
    "geglu": GeGLU,
}
check_registry("mlp", MLP_CLASSES, MLPS)


def build_mlp(cfg: ModelConfig) -> nn.Module:
    return MLP_CLASSES[cfg.mlp](cfg)
