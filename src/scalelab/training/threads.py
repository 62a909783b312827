"""Torch's CPU threads follow the machine's load during a run, not only at its start.

A run plans its threads when it starts (:func:`scalelab.runtime.thread_plan`). A job that
arrives later takes a core from under it: on a 2-core machine a one-thread busy loop started
mid-run cut a 2-thread run about 3x (fp32 28.5k to 8.4-10k tokens/s, bf16 57k to 13-17k), since
each OpenMP region waits for the thread that was descheduled. :class:`AdaptiveThreads` measures
other processes' CPU use every ``every_s`` seconds of training and sets the thread count by the
start's rule, back up when the cores are free again. A 1200-step
shakespeare_char run with such a job arriving 6 s in took 33.4 s this way, 82.2 s with its two
threads held, 34.7 s with one thread from the start (medians of 2, ``python -m
benchmarks.arriving_load --rounds 2``); looking every 2 s instead of 1, 35.6 s. A look costs
~0.1 ms.

A run that started beside other work (fewer threads) takes threads back when it leaves, up to
what an idle machine would have given it (:func:`scalelab.runtime.thread_ceiling`). Off where the
threads were fixed by hand (``train.num_threads``, ``OMP_NUM_THREADS``), on GPUs, and where even
an idle machine gives one thread. A thread count that changes can move a run's numbers at
rounding level (reductions split differently); fix the threads for runs that must repeat bit
for bit.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import pytorch_lightning as pl
import torch

from scalelab.runtime import (
    CpuSample,
    cpu_sample,
    other_load_between,
    thread_ceiling,
    threads_under_load,
)

log = logging.getLogger("scalelab.train")


class AdaptiveThreads(pl.Callback):
    """Every ``every_s`` seconds of training: other processes' busy cores over that interval
    (``/proc/stat``, ours and our children's CPU time taken out), then ``torch.set_num_threads``
    by :func:`scalelab.runtime.threads_under_load`, between 1 and ``ceiling``. Each change goes to
    the run's loggers as ``cpu_threads`` at its step (straight away: ``self.log`` would keep only
    the changes that fall on a logging step) and into ``changes`` as (step, threads, other
    processes' busy cores)."""

    def __init__(self, every_s: float = 1.0):
        super().__init__()
        if every_s <= 0:
            raise ValueError(f"AdaptiveThreads every_s={every_s!r}: must be > 0")
        self.every_s = float(every_s)
        self.start_threads = 0
        self.ceiling = 0
        self.changes: list[tuple[int, int, float]] = []
        self._last: CpuSample | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_threads = torch.get_num_threads()
        self.ceiling = thread_ceiling(self.start_threads)
        self._last = None
        if pl_module.device.type != "cpu" or self.ceiling < 2:
            return  # one thread whatever the load
        with contextlib.suppress(OSError):  # no /proc/stat (macOS): the start's plan stays
            self._last = cpu_sample()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._last is None or time.monotonic() - self._last.at < self.every_s:
            return
        now = cpu_sample()
        others = other_load_between(self._last, now)
        self._last = now
        had = torch.get_num_threads()
        want = threads_under_load(self.ceiling, others, current=had)
        if want == had:
            return
        torch.set_num_threads(want)
        step = int(trainer.global_step)
        self.changes.append((step, want, others))
        log.info("step %d: other processes busy on %.1f cores: torch threads %d -> %d",
                 step, others, had, want)
        for logger in trainer.loggers:
            logger.log_metrics({"cpu_threads": float(want)}, step=step)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.start_threads and torch.get_num_threads() != self.start_threads:
            torch.set_num_threads(self.start_threads)  # the process's own plan, for what follows
