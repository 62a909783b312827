"""A callback that sends a signal to its own training process after a given optimizer step, so
a test stops a run at a known step without timing. The step and signal come from
``$SCALELAB_TEST_SIGNAL_AT`` (``STEP:NAME``, e.g. ``5:SIGTERM``), not from the config: a resumed
run must repeat its config, and each attempt stops at a different step (the child imports it as
``tracking.signal_at_step``)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytorch_lightning as pl

ENV = "SCALELAB_TEST_SIGNAL_AT"


class SignalAtStep(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step, _, name = os.environ.get(ENV, "").partition(":")
        if step and trainer.global_step == int(step):
            os.kill(os.getpid(), signal.Signals[name or "SIGTERM"])
