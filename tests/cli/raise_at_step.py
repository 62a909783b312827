"""A callback that makes real training raise at a given optimizer step (for the
OnExceptionCheckpoint test; the child process imports it as ``cli.raise_at_step``)."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl


class RaiseAtStep(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"raised on purpose at step {trainer.global_step}")
