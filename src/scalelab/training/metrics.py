"""Metric bookkeeping of the LightningModules: token/FLOP counters, the training loss over an
accumulation window, validation sums, bits per byte and the total gradient norm."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

LN2 = math.log(2.0)


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """Bits per UTF-8 byte from a mean token loss in nats: loss / ln 2 / (bytes / token).

    It does not depend on the tokenizer, so runs with different vocabularies compare.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token={bytes_per_token!r}: must be > 0")
    return loss_nats_per_token / LN2 / bytes_per_token


def total_grad_norm(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """Total 2-norm over all gradients (one number, as clip_grad_norm_ sees it)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    return global_value(torch.nn.utils.get_total_norm(grads, norm_type=2.0))


def global_value(norm: torch.Tensor) -> torch.Tensor:
    """A norm as one global tensor: a DTensor (FSDP2) is gathered, anything else is returned."""
    full = getattr(norm, "full_tensor", None)
    return full() if callable(full) else norm


@dataclass
class RunCounters:
    """Tokens and model FLOPs trained on, over all devices and micro-batches (saved in checkpoints).

    A plain object, so the per-step updates are plain attribute writes, not ``nn.Module``'s
    checked ``__setattr__``.
    """

    tokens: int = 0
    flops: float = 0.0
    flops_per_token: dict[int, int] = field(default_factory=dict)  # by sequence length

    def add(self, tokens: int, seq_len: int, model_cfg: Any) -> None:
        fpt = self.flops_per_token.get(seq_len)
        if fpt is None:
            fpt = self.flops_per_token[seq_len] = model_cfg.flops_per_token(training=True, seq_len=seq_len)
        self.tokens += tokens
        self.flops += float(fpt) * tokens


class LossWindow:
    """The training loss summed over one logged optimizer step's micro-batches, kept on the
    device (no host sync) until that step logs its mean."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.n = 0

    def add(self, loss: torch.Tensor) -> None:
        d = loss.detach()
        self.total = d if self.total is None else self.total + d
        self.n += 1

    def take_mean(self) -> torch.Tensor | None:
        """The mean over the window, which then starts again; None when it saw no loss."""
        mean = self.total / self.n if self.total is not None and self.n else None
        self.reset()
        return mean

    def reset(self) -> None:
        self.total, self.n = None, 0


class ValSums:
    """Per-key sums over a validation epoch (float64 tensors), reduced over ranks at its end."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, **values: torch.Tensor) -> None:
        for k, v in values.items():
            v = v.detach().double()
            self.sums[k] = v if k not in self.sums else self.sums[k] + v

    def reduced(self, trainer: Any) -> dict[str, float]:
        """The sums over all ranks as floats (one all-reduce); {} when nothing was added."""
        keys = sorted(self.sums)
        if not keys:
            return {}
        stacked = torch.stack([self.sums[k] for k in keys])
        if trainer is not None and trainer.world_size > 1:
            stacked = trainer.strategy.reduce(stacked, reduce_op="sum")
        return {k: float(v) for k, v in zip(keys, stacked.tolist(), strict=True)}

    def reset(self) -> None:
        self.sums = {}
