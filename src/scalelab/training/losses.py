"""Token losses shared by training and validation, and the training step's compiled loss."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # labels that are not scored (padding, unmasked MLM positions)

LogitsOf = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
LossMean = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token cross-entropies in nats, number of scored tokens)."""
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return loss, (labels != IGNORE_INDEX).sum()


def token_loss_mean(logits: torch.Tensor, labels: torch.Tensor, every_label_scored: bool) -> torch.Tensor:
    """Mean token cross-entropy in nats over the scored labels; 0 where none is.

    When every label is scored (the causal LM's next tokens) cross-entropy's own mean is one
    kernel and its backward, where sum, count, clamp and divide take five.
    """
    if every_label_scored:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
    loss_sum, n = token_loss_sum(logits, labels)
    return loss_sum / n.clamp(min=1)


class CompiledLoss:
    """``batch -> mean token loss`` as one ``torch.compile`` graph, built at the first call.

    Forward and loss compile together so the cross-entropy fuses with the logits' fp32 upcast
    (outside the graph the fp32 logits are written and read back). Built lazily, from the
    module the strategy has set up by then. Only training uses it; validation runs eager.
    """

    def __init__(self, model: nn.Module, logits_of: LogitsOf, loss_mean: LossMean) -> None:
        self.model, self.logits_of, self.loss_mean = model, logits_of, loss_mean
        self.compiled: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.compiled is None:
            model, logits_of, loss_mean = self.model, self.logits_of, self.loss_mean

            def train_loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
                return loss_mean(logits_of(model, batch), batch["labels"])

            self.compiled = torch.compile(train_loss)
        return self.compiled(batch)
