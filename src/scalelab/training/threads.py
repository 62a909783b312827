"""Torch's CPU threads that follow the machine's load during a run (``train.threads_follow_load``).

A run takes its threads when it starts (:func:`scalelab.runtime.thread_plan`). A job that
arrives later takes a core from under it, and then each OpenMP region waits for the thread that
was descheduled, so a step can run several times slower than with fewer threads.
:class:`AdaptiveThreads` reads other processes' CPU use every ``every_s`` seconds of training
and sets the thread count by :func:`scalelab.runtime.threads_under_load`, between 1 and the
start's count, back up when the cores are free again.

Opt-in: a thread count that changes can move a run's numbers at rounding level (reductions
split differently), and runs that must repeat bit for bit keep their threads fixed.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from scalelab.runtime import threads_under_load

log = logging.getLogger("scalelab.train")


def _busy_ticks(stat: str, cpus: set[int]) -> int:
    """Non-idle clock ticks of ``cpus`` in a /proc/stat text (user..steal; idle and iowait not)."""
    busy = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy


def busy_cores_of_others(before: str, after: str, cpus: set[int], own_cpu_s: float,
                         elapsed_s: float, tick_hz: float) -> float:
    """Cores other processes kept busy between two /proc/stat texts (our own CPU time taken out)."""
    busy_s = (_busy_ticks(after, cpus) - _busy_ticks(before, cpus)) / tick_hz
    return max(0.0, (busy_s - own_cpu_s) / max(elapsed_s, 1e-6))


def _children_cpu_s(tick_hz: float) -> float:
    """CPU seconds of this process's live children (DataLoader workers): the run's own work."""
    total = 0.0
    for kids in Path("/proc/self/task").glob("*/children"):
        for pid in kids.read_text().split():
            try:  # after the ")" that ends the name, utime and stime are the 12th and 13th fields
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick_hz
            except (OSError, IndexError, ValueError):  # it ended between the two reads
                continue
    return total


def own_cpu_s() -> float:
    """CPU seconds of every thread of this process and of its live children."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime + _children_cpu_s(os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class CpuSample:
    """One reading of the machine's CPU counters and our own, to difference with a later one."""

    stat: str  # /proc/stat
    own_cpu_s: float
    at: float  # time.monotonic()


def cpu_sample() -> CpuSample:
    """Raises OSError where there is no /proc/stat (macOS)."""
    return CpuSample(Path("/proc/stat").read_text(), own_cpu_s(), time.monotonic())


class ProcStatLoad:
    """Cores other processes kept busy since the previous call, on the CPUs we may run on."""

    def __init__(self) -> None:
        self._last = cpu_sample()

    def __call__(self) -> float:
        now = cpu_sample()
        before, self._last = self._last, now
        return busy_cores_of_others(before.stat, now.stat, set(os.sched_getaffinity(0)),
                                    now.own_cpu_s - before.own_cpu_s, now.at - before.at,
                                    os.sysconf("SC_CLK_TCK"))


class AdaptiveThreads(pl.Callback):
    """Every ``every_s`` seconds of training: other processes' busy cores since the last look
    (``other_load``, by default :class:`ProcStatLoad`), then ``torch.set_num_threads`` by
    :func:`scalelab.runtime.threads_under_load`. Each change goes to the run's loggers as
    ``cpu_threads`` at its step (straight away: ``self.log`` would keep only the changes that fall
    on a logging step) and into ``changes`` as (step, threads, other processes' busy cores). The
    fit's end restores the start's count."""

    def __init__(self, every_s: float = 1.0,
                 other_load: Callable[[], Callable[[], float]] = ProcStatLoad) -> None:
        super().__init__()
        if every_s < 0:
            raise ValueError(f"AdaptiveThreads every_s={every_s!r}: must be >= 0")
        self.every_s = float(every_s)
        self.other_load = other_load  # makes the reader at fit start
        self.start_threads = 0
        self.changes: list[tuple[int, int, float]] = []
        self._read: Callable[[], float] | None = None
        self._looked_at = 0.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start_threads = torch.get_num_threads()
        self._read = None
        if pl_module.device.type != "cpu" or self.start_threads < 2:
            return  # one thread whatever the load
        try:
            self._read = self.other_load()
        except OSError:  # no /proc/stat (macOS): the start's count stays
            return
        self._looked_at = time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._read is None or time.monotonic() - self._looked_at < self.every_s:
            return
        others = self._read()
        self._looked_at = time.monotonic()
        had = torch.get_num_threads()
        want = threads_under_load(self.start_threads, others, current=had)
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
            torch.set_num_threads(self.start_threads)
