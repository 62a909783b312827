"""Normalization layers, chosen by name (``norm: layernorm | rmsnorm``).

A variant is a class in NORM_CLASSES plus its row in variants.NORMS (gain, bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .variants import NORMS, check_registry


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) * g (+ b). Bias only when cfg.bias (nanoGPT style)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.eps = cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))
        self.bias = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g (Zhang & Sennrich 2019). No centering, no bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.eps = cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in float32: the mean of squares loses precision in bf16/fp16.
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).type_as(x)


NORM_CLASSES: dict[str, type[nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
check_registry("norm", NORM_CLASSES, NORMS)


def build_norm(cfg: ModelConfig) -> nn.Module:
    return NORM_CLASSES[cfg.norm](cfg)
