"""AdaptiveThreads in a real Lightning fit, with real busy processes arriving beside it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader

from scalelab import runtime as R
from scalelab.training.threads import AdaptiveThreads

from .conftest import cpu_trainer


class Matmuls(pl.LightningModule):
    """Enough work per step to keep the threads busy; records the threads each step ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(192, 192) / 14)
        self.threads_seen: list[int] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.threads_seen.append(torch.get_num_threads())
        return (batch @ self.w @ self.w).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def test_a_run_gives_up_threads_when_other_jobs_take_its_cores(
        tmp_path: Path, strangers_spinning, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started with a thread per core; as many busy jobs as cores arrive: within one interval
    the run drops to fewer threads, its steps run with them, the change reaches the logger at
    its step, and the fit hands the process back its own count."""
    cores = R.available_cores()
    if cores < 2:
        pytest.skip("one core: a run has no thread to give up")
    monkeypatch.delenv(R.CONCURRENT_ENV, raising=False)  # the load alone must decide
    torch.set_num_threads(cores)  # the start's plan on an idle machine (undone by the fixture)
    module, governor = Matmuls(), AdaptiveThreads(every_s=0.5)
    data = DataLoader([torch.randn(64, 192) for _ in range(8)], batch_size=None)
    trainer = cpu_trainer(-1, tmp_path, max_epochs=-1, max_time={"seconds": 4}, callbacks=[governor],
                          logger=CSVLogger(tmp_path, name="t", version=0))
    with strangers_spinning(cores):
        trainer.fit(module, data)
    assert governor.start_threads == cores and governor.ceiling == cores
    step, threads, others = governor.changes[0]
    assert threads < cores and others >= 0.5, governor.changes
    assert min(module.threads_seen) == min(t for _, t, _ in governor.changes)  # steps ran with it
    with (tmp_path / "t" / "version_0" / "metrics.csv").open() as f:
        logged = [(int(r["step"]), float(r["cpu_threads"])) for r in csv.DictReader(f) if r["cpu_threads"]]
    assert logged[0] == (step, float(threads))
    assert torch.get_num_threads() == cores  # back to the process's own plan after the fit


def test_a_run_with_one_thread_whatever_the_load_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One core per scalelab process (a sweep's points): even an idle machine gives one thread."""
    monkeypatch.setenv(R.CONCURRENT_ENV, str(R.available_cores()))
    torch.set_num_threads(1)
    governor = AdaptiveThreads(every_s=0.01)
    trainer = cpu_trainer(3, tmp_path, callbacks=[governor])
    trainer.fit(Matmuls(), DataLoader([torch.randn(8, 192) for _ in range(3)], batch_size=None))
    assert governor.changes == [] and governor._last is None and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="every_s"):
        AdaptiveThreads(every_s=0)
