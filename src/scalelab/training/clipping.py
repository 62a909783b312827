"""Gradient clipping for ``LMModule.configure_gradient_clipping``, returning the total norm.

Norm clipping is ``torch.nn.utils.clip_grad_norm_`` over the optimizer's parameters, as in
Lightning's precision plugins (gradients are unscaled by then). It is called here, not through
``LightningModule.clip_gradients``, because it returns the norm the ``grad_norm`` metric needs
and because Lightning's mixed-precision plugin refuses to clip for a fused optimizer even under
bf16, which has no loss scaling.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DeepSpeedStrategy, FSDPStrategy

from scalelab.training.metrics import global_value


def clip_gradients(module: pl.LightningModule, optimizer: torch.optim.Optimizer, value: float,
                   algorithm: str | None) -> torch.Tensor | None:
    """Clip ``module``'s gradients to ``value`` by norm (default) or by value; the total norm
    before clipping where the clip computed it, else None."""
    strategy = module.trainer.strategy
    if not value:
        return None
    if isinstance(strategy, DeepSpeedStrategy):  # its engine clips inside its own step
        module.clip_gradients(optimizer, value, algorithm)
        return None
    if str(algorithm or "norm").lower() == "value":
        torch.nn.utils.clip_grad_value_(module.parameters(), value)
        return None
    if isinstance(strategy, FSDPStrategy):  # the root's norm covers every rank's shards
        return strategy.model.clip_grad_norm_(value)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    # torch picks foreach kernels by itself on GPUs only; on the CPU they halve the time
    foreach = True if module.device.type == "cpu" else None
    return global_value(torch.nn.utils.clip_grad_norm_(params, value, foreach=foreach))
