"""A Lightning callback the training bench adds to ``scalelab-train`` from the command line
(``+callbacks.bench_phases={_target_: benchmarks.phase_timer.PhaseTimer, path: ...}``) to time
what a run spends between optimizer steps.

Per training batch: wall and CPU seconds from ``on_train_batch_start`` to ``on_train_batch_end``.
Between two batches: the gap, attributed to validation when a validation ran inside it (so it
holds validation, the sample and the checkpoints Lightning writes at that validation). At the
end of ``fit``: the time stamp, so the caller can measure what comes after (final validation,
sample, checkpoint, MLflow upload, exit) from the process's end, and the CPU used by then by the
run's helper processes (the MLflow tracking process).

With ``lockstep="R,W"`` (two pipe ends the bench passed down), the run takes turns with the
bench's plain loop after every optimizer step from ``skip`` on: it writes one byte to W and
waits for one byte on R while the bench runs one plain-loop step. Each turn's *cycle* is
everything the run did since it got the turn back (Lightning's loop, data, callbacks, logging,
the step itself) up to the end of its next optimizer step, so the two sides' step times come
from the same seconds of the machine, A B A B, as the bench's plain loops do. The pauses are
recorded too, with the CPU the run's own threads used while it waited (charged to the run).

With ``every=K`` a turn is K optimizer steps (the GPU bench's 10): a GPU step is queued, so a
turn must end with a synchronize, and one after every step would expose each side's host work
that a real run overlaps with the GPU's. The plain loop's turns are K steps too.
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
        self.steps: list[tuple[float, float]] = []  # (wall, cpu) per training batch
        self.val_gaps: list[tuple[float, float]] = []  # (wall, cpu) of gaps that held a validation
        self.other_gaps: list[tuple[float, float]] = []
        self._start: tuple[float, float] | None = None
        self._end: tuple[float, float] | None = None
        self._validated = False
        self.first_step_cpu: float | None = None
        self.first_step_helpers_cpu: float | None = None
        self.turns = RunTurns.from_arg(lockstep)
        self.skip, self.every = skip, max(1, int(every))
        self._last_step = -1

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = self._now()
        if self._end is not None:
            gap = (now[0] - self._end[0], now[1] - self._end[1])
            (self.val_gaps if self._validated else self.other_gaps).append(gap)
        self._start, self._validated = now, False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = int(trainer.global_step)
        turns = self.turns
        hand_over = (turns is not None and turns.active and step != self._last_step
                     and step >= self.skip and (step - self.skip) % self.every == 0)
        if (hand_over or turns is None) and getattr(pl_module, "device", torch.device("cpu")).type == "cuda":
            # the GPU work, not its queueing: without this, work still queued when the turn
            # passes runs in the plain loop's time (its turns synchronize at both ends)
            torch.cuda.synchronize(pl_module.device)
        now = self._now()
        if self._start is not None:
            self.steps.append((now[0] - self._start[0], now[1] - self._start[1]))
        if self.first_step_cpu is None:  # CPU seconds since the process started: load-robust
            self.first_step_cpu, self.first_step_helpers_cpu = now[1], helpers_cpu()
        if hand_over and turns is not None:
            now = turns.hand_over(now, int(getattr(pl_module, "tokens_seen", 0)))
        self._last_step = step
        self._end = now

    def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._validated = True
        if self.turns is not None:
            self.turns.validated = True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        # a validation (with its sample and checkpoints) after the last batch, inside fit
        if self._end is not None and self._validated:
            now = self._now()
            self.val_gaps.append((now[0] - self._end[0], now[1] - self._end[1]))
        if self.turns is not None:
            self.turns.close()
        self.path.write_text(json.dumps({
            "steps": self.steps, "val_gaps": self.val_gaps, "other_gaps": self.other_gaps,
            "fit_end_unix": time.time(), "fit_end_cpu": time.process_time(),
            "first_step_cpu": self.first_step_cpu, "first_step_helpers_cpu": self.first_step_helpers_cpu,
            "fit_end_helpers_cpu": helpers_cpu(),
            **(self.turns.record() if self.turns is not None else {"cycles": [], "pauses": []}),
        }))


def helpers_cpu() -> float:
    """CPU seconds so far of the run's live child processes: the MLflow tracking process. The
    bench reads a whole run's CPU from its process tree after exit, which counts the tracking
    process's start-up (importing mlflow, on the other core before the first step) as if it came
    after fit; these two readings put it where it happened."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += t.user + t.system
    return total
