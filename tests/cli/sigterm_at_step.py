"""A callback that sends SIGTERM to its own training process at a given optimizer step, so a
test gets a real signal at a known point without timing (the child imports it as
``cli.sigterm_at_step``)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytorch_lightning as pl


class SigtermAtStep(pl.Callback):
    """``job``: only in that job of a ``-m`` multirun (Hydra's job number), else in every run."""

    def __init__(self, step: int, job: int | None = None) -> None:
        self.step, self.job = step, job

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        if self.job is not None:
            from hydra.core.hydra_config import HydraConfig

            if HydraConfig.get().job.num != self.job:
                return
        os.kill(os.getpid(), signal.SIGTERM)
