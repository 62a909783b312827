"""Per-step work: train metrics only on the steps Lightning logs; throughput extras."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loggers.logger import Logger

from .conftest import cpu_trainer
from .test_callbacks import loader, tiny_module


class ListLogger(Logger):
    """Keeps every log_metrics call (a real Lightning logger, in memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "list"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


def test_train_metrics_are_computed_on_logged_steps_and_the_last() -> None:
    from scalelab.training import ThroughputMonitor

    steps, every = 12, 5
    module = tiny_module(steps)
    logger = ListLogger()
    monitor = ThroughputMonitor(every_n_steps=5)
    norms: list[float] = []

    class Probe(pl.Callback):  # the grad norm Lightning holds after each step
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            norms.append(float(trainer.callback_metrics.get("grad_norm", -1.0)))

    trainer = cpu_trainer(steps, logger=logger, log_every_n_steps=every, limit_val_batches=0,
                          callbacks=[monitor, Probe()])
    trainer.fit(module, loader(steps * 4, 4))
    # computed on steps 5, 10 and the last (12) only: each new value appears there
    changed = [i + 1 for i, n in enumerate(norms) if n != (norms[i - 1] if i else -1.0)]
    assert changed == [5, 10, 12], norms
    logged = [step for step, m in logger.rows if "grad_norm" in m]
    assert logged == [4, 9]  # Lightning's 0-based steps 5 and 10
    # the last step still sets train/loss (final/train_loss of scalelab-train reads it)
    assert int(trainer.global_step) == steps and "train/loss" in trainer.callback_metrics
    cpu = [m["tokens_per_cpu_sec"] for _, m in logger.rows if "tokens_per_cpu_sec" in m]
    assert cpu and all(v > 0 for v in cpu)
    assert monitor.summary["time_to_first_step"] > 0
