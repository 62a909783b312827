"""Optuna pruning inside a run: report the validation loss to the trial, stop when it says so.

The search (hydra_plugins/scalelab_optuna) asks Optuna for a trial and hands its number to the
job (``optuna_trial``). The job opens that trial in the study's RDB storage (a SQLite file, or
PostgreSQL shared by a cluster's jobs) in whatever process the launcher runs it: the search's
own (basic), a joblib worker or a SLURM job. ``trial.report`` / ``should_prune`` then read and
write the shared storage, so the pruner compares with every other trial's reports. A pruned run
ends like any stopped run (checkpoint, final values) and leaves the step in the trial's user
attribute ``pruned_at_step``; the search reads it and tells Optuna PRUNED.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl

log = logging.getLogger("scalelab.train")
PRUNED_AT = "pruned_at_step"  # the trial's user attribute: the step its run was stopped at


def make_pruner(name: str, startup_trials: int, warmup_steps: int) -> Any:
    """The search's pruner by name; the job builds the same one to decide for its trial."""
    import optuna

    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=int(startup_trials),
                                           n_warmup_steps=int(warmup_steps))
    raise ValueError(f"hydra.sweeper.pruner={name!r}: choose median or none")


def open_trial(storage: str, study_name: str, number: int, pruner: Any) -> Any:
    """Trial ``number`` of the study in ``storage`` (an RDB URL), as an ``optuna.trial.Trial``
    whose ``report`` / ``should_prune`` go to that storage (Optuna's public storage API)."""
    import optuna

    try:
        store = optuna.storages.RDBStorage(storage)
        # the job only reports: a plain sampler, so nothing is sampled or fitted here
        study = optuna.load_study(study_name=study_name, storage=store, pruner=pruner,
                                  sampler=optuna.samplers.RandomSampler())
        study_id = store.get_study_id_from_name(study_name)
        trial_id = store.get_trial_id_from_study_id_trial_number(study_id, number)
    except Exception as e:  # the job cannot reach the search's study: one line, the fix
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"hydra.sweeper.storage: this trial's job cannot open trial {number} of study "
            f"{study_name!r} ({why}); trials in other processes or machines need a storage they "
            "all reach: set SCALELAB_OPTUNA_STORAGE to a PostgreSQL URL (make cluster-up prints "
            "one)") from None
    return optuna.trial.Trial(study, trial_id)


class PruneOnValLoss(pl.Callback):
    """``trial.report(val/loss, step)`` after each validation; ``should_prune`` stops the fit.

    Every rank has one: rank 0 holds the trial (``trial=None`` elsewhere) and its decision
    reaches all ranks, so they stop together."""

    def __init__(self, trial: Any | None, monitor: str = "val/loss",
                 on_prune: Callable[[int, float], None] | None = None) -> None:
        self.trial, self.monitor, self.on_prune = trial, monitor, on_prune
        self.pruned_at: int | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or value is None or self.pruned_at is not None:
            return
        step = int(trainer.global_step)
        prune = False
        if self.trial is not None:
            self.trial.report(float(value), step)
            prune = bool(self.trial.should_prune())
        if not trainer.strategy.reduce_boolean_decision(prune, all=False):
            return
        self.pruned_at = step
        if self.trial is not None:
            self.trial.set_user_attr(PRUNED_AT, step)
            log.info("optuna: trial %d pruned at step %d (%s %.4f)", self.trial.number, step,
                     self.monitor, float(value))
        if self.on_prune is not None:
            self.on_prune(step, float(value))
        trainer.should_stop = True
