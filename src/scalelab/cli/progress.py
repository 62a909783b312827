"""Progress for `scalelab-train`: a tqdm bar on a terminal, plain lines everywhere else.

When stdout is not a TTY (a pipe, `nohup`, a CI log, a SLURM output file), a tqdm bar writes a
carriage-return frame at every refresh (~123 KB for `debug=overfit`). ``LineProgress`` writes one
plain log line every ``callbacks.progress_bar.plain_every`` optimizer steps instead, through
``logging`` so it also lands in train.log.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks.progress.progress_bar import ProgressBar

from scalelab.config.schema import ProgressBarSchema

log = logging.getLogger("scalelab.train")


def _value(metrics: Any, *keys: str) -> float | None:
    for key in keys:
        if key in metrics:
            v = metrics[key]
            return float(v.item() if hasattr(v, "item") else v)
    return None


class LineProgress(ProgressBar):
    """One line per ``every`` optimizer steps: step, %, loss, lr, tokens/s, last val, ETA."""

    def __init__(self, every: int = 50) -> None:
        super().__init__()
        self.every = max(1, int(every))
        self._enabled = True
        self._last_step = -1
        self._t0: float | None = None
        self._step0 = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0, self._step0 = time.time(), int(trainer.global_step)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step, total = int(trainer.global_step), int(trainer.max_steps)
        if not self._enabled or step == self._last_step:
            return
        if step % self.every and step != total:
            return
        self._last_step = step
        cm = trainer.callback_metrics
        parts = [f"step {step:>{len(str(total))}}/{total} ({100 * step / max(total, 1):3.0f}%)"]
        for label, keys, fmt in (("loss", ("train/loss",), "{:.4f}"), ("lr", ("lr",), "{:.3g}"),
                                 ("tok/s", ("tokens_per_sec",), "{:,.0f}"),
                                 ("mfu", ("mfu",), "{:.3f}"),
                                 ("val", ("val/loss",), "{:.4f}")):
            v = _value(cm, *keys)
            if v is not None:
                parts.append(f"{label} {fmt.format(v)}")
        if self._t0 is not None and step > self._step0:
            rate = (time.time() - self._t0) / (step - self._step0)
            parts.append(f"eta {_duration(rate * (total - step))}")
        log.info("  ".join(parts))


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_callback(settings: ProgressBarSchema) -> ProgressBar:
    """tqdm on a terminal, ``LineProgress`` when stdout is a pipe or a file."""
    pb = settings
    if sys.stdout.isatty():
        from scalelab.cli.callbacks import ProgressBar as Bar

        return Bar(refresh_rate=int(pb.refresh_rate))
    return LineProgress(every=int(pb.plain_every))
