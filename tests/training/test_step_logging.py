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


def _throughput_rows(every_n_steps: int | None) -> tuple[list[int], list[tuple[int, float]]]:
    """(the 1-based steps where a new tokens/s was computed, the logger's tokens/s rows) of a
    12-step run that Lightning writes every 3 steps."""
    from scalelab.training import ThroughputMonitor

    steps, seen, logger = 12, [], ListLogger()

    class Probe(pl.Callback):  # the tokens/s Lightning holds after each step
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append(float(trainer.callback_metrics.get("tokens_per_sec", -1.0)))

    trainer = cpu_trainer(steps, logger=logger, log_every_n_steps=3, limit_val_batches=0,
                          callbacks=[ThroughputMonitor(every_n_steps=every_n_steps), Probe()])
    trainer.fit(tiny_module(steps), loader(steps * 4, 4))
    computed = [i + 1 for i, v in enumerate(seen) if v != (seen[i - 1] if i else -1.0)]
    return computed, [(step, m["tokens_per_sec"]) for step, m in logger.rows if "tokens_per_sec" in m]


def test_throughput_windows_end_on_the_steps_lightning_writes() -> None:
    """By default a window is Lightning's logging cadence: each written row is a new value. A
    window that is not a multiple of the cadence is rounded up to one, so no value is computed
    on a step Lightning does not write (5 steps under a cadence of 3 was computed at 5 and 10,
    and written 1-3 steps later)."""
    from scalelab.training.callbacks import window_steps

    assert [window_steps(w, 3) for w in (None, 1, 3, 5, 6, 7)] == [3, 3, 3, 6, 6, 9]
    computed, rows = _throughput_rows(None)
    assert computed == [3, 6, 9, 12]
    assert [step for step, _ in rows] == [2, 5, 8, 11] and len({v for _, v in rows}) == 4
    computed, rows = _throughput_rows(5)
    assert computed == [6, 12]
    # Lightning writes an on-step value again at each writing step until it is logged anew
    assert [step for step, _ in rows] == [5, 8, 11] and rows[0][1] == rows[1][1] != rows[2][1]
