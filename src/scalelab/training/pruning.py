"""Optuna pruning inside a run: report the validation loss to the trial, stop when it says so.

The search (hydra_plugins/scalelab_optuna) asks Optuna for a trial and runs the job in the same
process (Hydra's basic launcher); it leaves the trial here under its number, and the job's
``optuna.trial`` key picks it up. The run then ends like any stopped run (checkpoint, final
values) and the search tells Optuna PRUNED. Only a trial's public ``report`` / ``should_prune``
are used; no optuna import is needed here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl

log = logging.getLogger("scalelab.train")
ACTIVE_TRIALS: dict[int, Any] = {}  # trial number -> optuna.trial.Trial, set by the search
PRUNED: set[int] = set()  # trial numbers whose run the pruner stopped (the search reads them)


class PruneOnValLoss(pl.Callback):
    """``trial.report(val/loss, step)`` after each validation; ``should_prune`` stops the fit."""

    def __init__(self, trial: Any, monitor: str = "val/loss",
                 on_prune: Callable[[int, float], None] | None = None) -> None:
        self.trial, self.monitor, self.on_prune = trial, monitor, on_prune
        self.pruned_at: int | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or value is None or self.pruned_at is not None:
            return
        step = int(trainer.global_step)
        self.trial.report(float(value), step)
        if self.trial.should_prune():
            self.pruned_at = step
            PRUNED.add(int(self.trial.number))
            log.info("optuna: trial %d pruned at step %d (%s %.4f)", self.trial.number, step,
                     self.monitor, float(value))
            if self.on_prune is not None:
                self.on_prune(step, float(value))
            trainer.should_stop = True
