"""AdaptiveThreads in a real Lightning fit, and the /proc/stat reading it uses by default."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader

from scalelab import runtime as R
from scalelab.training import threads as T
from scalelab.training.threads import AdaptiveThreads

from .conftest import cpu_trainer


class Matmuls(pl.LightningModule):
    """A little work per step; records the threads each step ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 64) / 8)
        self.threads_seen: list[int] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.threads_seen.append(torch.get_num_threads())
        return (batch @ self.w).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def scripted(loads: list[float]) -> Callable[[], Callable[[], float]]:
    """A load reader that reports ``loads`` one look after another (then the last one)."""
    def make() -> Callable[[], float]:
        it: Iterator[float] = iter(loads)
        return lambda: next(it, loads[-1])
    return make


@pytest.fixture
def threads_restored() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_run_gives_up_threads_while_other_jobs_hold_its_cores_and_takes_them_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads_restored: None) -> None:
    """Looking every step: other jobs on every core drop the run to one thread, its steps run
    with it, the changes reach the logger at their steps, and the fit restores the start's count."""
    monkeypatch.delenv(R.CONCURRENT_ENV, raising=False)
    cores = R.available_cores()
    torch.set_num_threads(2)  # the start's count (2 threads fit any machine's rule below)
    module = Matmuls()
    governor = AdaptiveThreads(every_s=0, other_load=scripted([0.0, float(cores), float(cores),
                                                               0.0]))
    trainer = cpu_trainer(8, tmp_path, callbacks=[governor],
                          logger=CSVLogger(tmp_path, name="t", version=0))
    trainer.fit(module, DataLoader([torch.randn(16, 64) for _ in range(8)], batch_size=None))
    if cores < 2:  # the only rule for one core: one thread
        assert [t for _, t, _ in governor.changes] == [1]
        return
    assert [(step, t) for step, t, _ in governor.changes] == [(2, 1), (4, 2)]
    assert module.threads_seen == [2, 2, 1, 1, 2, 2, 2, 2]  # step 3 and 4 ran with one thread
    with (tmp_path / "t" / "version_0" / "metrics.csv").open() as f:
        logged = [(int(r["step"]), float(r["cpu_threads"])) for r in csv.DictReader(f)
                  if r.get("cpu_threads")]
    assert logged == [(2, 1.0), (4, 2.0)]
    assert torch.get_num_threads() == 2


def test_the_fit_end_restores_the_start_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              threads_restored: None) -> None:
    monkeypatch.delenv(R.CONCURRENT_ENV, raising=False)
    torch.set_num_threads(2)
    governor = AdaptiveThreads(every_s=0, other_load=scripted([64.0]))  # busy to the end
    trainer = cpu_trainer(3, tmp_path, callbacks=[governor])
    trainer.fit(Matmuls(), DataLoader([torch.randn(8, 64) for _ in range(3)], batch_size=None))
    assert [t for _, t, _ in governor.changes] == [1]
    assert torch.get_num_threads() == 2


def test_a_run_with_one_thread_is_left_alone(tmp_path: Path, threads_restored: None) -> None:
    torch.set_num_threads(1)
    asked: list[int] = []
    governor = AdaptiveThreads(every_s=0, other_load=lambda: asked.append(1) or (lambda: 0.0))
    trainer = cpu_trainer(3, tmp_path, callbacks=[governor])
    trainer.fit(Matmuls(), DataLoader([torch.randn(8, 64) for _ in range(3)], batch_size=None))
    assert governor.changes == [] and asked == [] and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="every_s"):
        AdaptiveThreads(every_s=-1)


STAT_BEFORE = ("cpu  300 0 30 600 10 0 0 0 0 0\n"
               "cpu0 100 0 10 200 5 0 0 0 0 0\ncpu1 100 0 10 200 5 0 0 0 0 0\n"
               "cpu2 100 0 10 200 0 0 0 0 0 0\nintr 1 2 3\n")
# 1 s at 100 ticks/s: cpu0 busy 80 ticks (20 idle), cpu1 busy 30 (+10 iowait), cpu2 busy 100
STAT_AFTER = ("cpu  510 0 30 690 20 0 0 0 0 0\n"
              "cpu0 170 0 20 220 5 0 0 0 0 0\ncpu1 120 0 20 260 15 0 0 0 0 0\n"
              "cpu2 200 0 10 200 0 0 0 0 0 0\nintr 1 2 3\n")


def test_busy_cores_come_from_the_cpus_we_may_use_minus_our_own_time() -> None:
    busy = T.busy_cores_of_others(STAT_BEFORE, STAT_AFTER, {0, 1}, own_cpu_s=0.0,
                                  elapsed_s=1.0, tick_hz=100)
    assert busy == pytest.approx(1.1)  # cpu2 is outside the affinity; iowait is not busy
    busy = T.busy_cores_of_others(STAT_BEFORE, STAT_AFTER, {0, 1}, own_cpu_s=0.5,
                                  elapsed_s=1.0, tick_hz=100)
    assert busy == pytest.approx(0.6)
    assert T.busy_cores_of_others(STAT_BEFORE, STAT_AFTER, {0}, own_cpu_s=2.0, elapsed_s=1.0,
                                  tick_hz=100) == 0.0  # never negative


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat")
def test_a_busy_process_shows_in_the_reading(strangers_spinning) -> None:
    """Another user's busy loop counts as other load (this test's own CPU time does not)."""
    with strangers_spinning(1):
        read = T.ProcStatLoad()
        time.sleep(0.5)
        seen = read()
    assert seen >= 0.3, seen  # a whole core, shared with whatever else the machine runs


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_our_own_children_count_as_our_cpu_time() -> None:
    """A DataLoader worker is part of the run: its CPU time is the run's own, never other load."""
    burn = ("import sys, time\n"
            "while time.process_time() < 0.6: pass\n"
            "print('done', flush=True)\n"
            "sys.stdin.read()\n")  # alive, idle, until the test closes its stdin
    before = T.own_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        assert T.own_cpu_s() - before >= 0.5  # /proc counts whole clock ticks
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
