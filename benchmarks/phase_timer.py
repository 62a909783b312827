"""A Lightning callback the bench adds to ``scalelab-train`` from the command line, with public
hooks only. Into a JSON file: each gap between batches that held a validation (with its sample
and checkpoints), the clock at the first step and at the end of fit, the last ``val/loss``, the
final step, and the tokens of its batches (counted as the bench's plain loops count them).

With ``lockstep="R,W"`` (pipe ends from the bench) the run hands the turn to the bench after
every ``every`` optimizer steps from step ``skip`` on (lockstep.py). On a GPU each turn ends
with a synchronize, so queued work is charged to the side that queued it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from benchmarks.lockstep import RunTurns


class PhaseTimer(pl.Callback):
    def __init__(self, path: str, lockstep: str | None = None, skip: int = 3, every: int = 1) -> None:
        self.path = Path(path)
        self.val_gaps: list[tuple[float, float]] = []  # (wall, cpu) of gaps that held a validation
        self.turns = RunTurns.from_arg(lockstep)
        self.skip, self.every = skip, max(1, int(every))
        self.tokens, self.first_step_unix, self.fit_end_unix = 0, None, None
        self.val_loss: float | None = None
        self.final_step = 0
        self._end: tuple[float, float] | None = None
        self._validated, self._last_step = False, -1

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = self._now()
        if self._end is not None and self._validated:
            self.val_gaps.append((now[0] - self._end[0], now[1] - self._end[1]))
        self._validated = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step, turns = int(trainer.global_step), self.turns
        self.tokens += int(batch["tgt_in" if "tgt_in" in batch else "input_ids"].numel())
        hand_over = (turns is not None and turns.active and step != self._last_step
                     and step >= self.skip and (step - self.skip) % self.every == 0)
        if hand_over and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        now = self._now()
        if self.first_step_unix is None:
            self.first_step_unix = time.time()
        if hand_over and turns is not None:
            now = turns.hand_over(now, self.tokens)
        self._last_step, self._end = step, now

    def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._validated = True
        if self.turns is not None:
            self.turns.validated = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        loss = trainer.callback_metrics.get("val/loss")
        if loss is not None:
            self.val_loss = float(loss)
        if self.fit_end_unix is not None:  # a validation after fit: its loss is the final one
            self.write()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._end is not None and self._validated:  # the validation after the last batch
            now = self._now()
            self.val_gaps.append((now[0] - self._end[0], now[1] - self._end[1]))
        if self.turns is not None:
            self.turns.close()
        self.fit_end_unix, self.final_step = time.time(), int(trainer.global_step)
        self.write()

    def write(self) -> None:
        self.path.write_text(json.dumps({
            "val_gaps": self.val_gaps, "tokens": self.tokens,
            "first_step_unix": self.first_step_unix, "fit_end_unix": self.fit_end_unix,
            "val_loss": self.val_loss, "final_step": self.final_step,
            **(self.turns.record() if self.turns is not None else {"cycles": [], "pauses": []}),
        }))
