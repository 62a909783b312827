"""A callback that sends SIGTERM to its own training process at a given optimizer step, so a
test gets a real signal at a known point without timing (the child imports it as
``cli.sigterm_at_step``)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytorch_lightning as pl


class SigtermAtStep(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
