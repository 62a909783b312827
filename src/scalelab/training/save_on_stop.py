"""``SaveOnStop``: the Lightning callback that ends a signalled run at a step boundary with a
resumable ``last.ckpt`` (the signals themselves: ``training/signals.py``)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities.exceptions import SIGTERMException

from scalelab.training.signals import STOP, StopRequest

log = logging.getLogger("scalelab.train")


class SaveOnStop(pl.Callback):
    """Stops the loop at a step boundary once a signal came, and writes ``last.ckpt`` then.

    The stop is Lightning's own SIGTERM stop: after the optimizer step that follows the signal
    (its metrics logged, its validation run), the process sends itself SIGTERM; Lightning's
    handler sets ``trainer.received_sigterm`` and its loop raises ``SIGTERMException`` at the
    end of that step. That is the one boundary where Lightning's progress counters and its
    logging step agree, so a run resumed from the checkpoint logs every step exactly once,
    however many times it was stopped (a stop raised from ``on_train_batch_start`` comes after
    the next batch is counted as fetched, and Lightning resumes such a checkpoint one logging
    step ahead). Like Lightning's OnExceptionCheckpoint, but only for signal stops (a crash
    must not overwrite the last good checkpoint), and not a subclass of it: with one of those
    in the callbacks, Lightning turns ``fit(ckpt_path=None)`` into ``"last"`` and would
    silently resume a fresh run from an old file in the same folder.
    """

    def __init__(self, dirpath: Path, stop: StopRequest = STOP) -> None:
        self.ckpt_path = Path(dirpath) / "last.ckpt"
        self.stop = stop
        self._step_at_start = 0
        self._asked = False  # SIGTERM sent to this process for Lightning's stop

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.stop.trainer = trainer  # from now on a signal waits for a step boundary
        self._asked = False

    def _stopping(self, trainer: pl.Trainer) -> bool:
        # Under DDP every rank takes the same decision (any rank signalled: all stop), so none
        # is left waiting alone in the next all-reduce; this is the broadcast Lightning does
        # for its own SIGTERM flag. Every rank runs every batch hook, so the collective is safe.
        return trainer.strategy.reduce_boolean_decision(self.stop.signum is not None, all=False)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step
        # Only if Lightning did not stop at the end of the step it was asked to (its SIGTERM
        # handler is not installed, as in a Trainer outside the main thread): stop here.
        if self._asked and self._stopping(trainer):
            raise SIGTERMException

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        stepped = trainer.global_step != self._step_at_start  # not inside a grad accumulation
        if not stepped or self._asked or not self._stopping(trainer):
            return
        self._asked = True
        if not trainer.received_sigterm:  # a SIGTERM itself already set it
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        # A local decision, as in Lightning's evaluation loop: ranks may run unequal numbers
        # of validation batches, so a collective per batch could wait forever.
        if self.stop.signum is not None:
            raise SIGTERMException

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.stop.trainer = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        # SIGTERMException: raised at a batch boundary (and on all ranks at once under DDP);
        # anything else may have interrupted an optimizer step halfway.
        if not isinstance(exception, SIGTERMException) or trainer.global_step == 0:
            return
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        trainer.save_checkpoint(self.ckpt_path)
        if trainer.is_global_zero:
            log.warning("saved %s at step %d", self.ckpt_path, trainer.global_step)


__all__ = ["SaveOnStop"]
