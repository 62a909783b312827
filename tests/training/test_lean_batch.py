"""A training batch's loop bookkeeping without Lightning's pass-along layers (training/lean_batch.py):
in each case below, a fit on the lean path makes the same hook calls with the same
``_current_fx_name``, the same loop state, logged rows, outputs and weights as Lightning's own
path. ``_run`` (test_lean_optimization.py) traces both and counts the batches taken lean."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from scalelab.training.hook_plan import FX, HookPlan

from .conftest import cpu_trainer
from .test_callbacks import loader, tiny_module
from .test_lean_optimization import STEPS, _run, _same_run


def _both(tmp_path: Path, steps: int = STEPS, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    lean = _run(tmp_path / "lean", True, **kw)
    lightning = _run(tmp_path / "lightning", False, **kw)
    _same_run(lean, lightning, steps)
    assert lightning["lean_batches"] == 0
    return lean, lightning


def test_a_module_hook_that_returns_minus_one_ends_the_epoch_as_lightnings_does(tmp_path: Path) -> None:
    def setup(module: pl.LightningModule) -> None:
        traced = module.on_train_batch_start

        def on_train_batch_start(batch: Any, batch_idx: int) -> int | None:
            traced(batch, batch_idx)
            return -1 if batch_idx == 4 else None  # every epoch ends at its fifth batch

        module.on_train_batch_start = on_train_batch_start  # type: ignore[method-assign]

    lean, _ = _both(tmp_path, module_setup=setup, max_epochs=2, max_steps=-1, steps=8)
    assert lean["trainer"].current_epoch == 2 and lean["lean_batches"] == 10


def test_a_batch_the_loader_yields_as_none_is_skipped_as_lightning_skips_it(tmp_path: Path) -> None:
    rows = list(loader(STEPS * 2, 2))
    rows.insert(2, None)
    lean, _ = _both(tmp_path, train=DataLoader(rows, batch_size=None, collate_fn=lambda b: b))
    assert lean["lean_batches"] == STEPS + 1


def test_a_plateau_scheduler_is_stepped_as_lightning_steps_it(tmp_path: Path) -> None:
    def setup(module: pl.LightningModule) -> None:
        def configure_optimizers() -> dict[str, Any]:
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "train/loss",
                                                       "interval": "step", "frequency": 2}}
        module.configure_optimizers = configure_optimizers  # type: ignore[method-assign]

    lean, _ = _both(tmp_path, module_setup=setup, log_every_n_steps=1)
    assert sum(hook == "lr_scheduler_step" for _, hook, _ in lean["seen"]) == STEPS // 2


def test_a_scheduler_stepped_every_other_batch_is_stepped_as_lightning_steps_it(tmp_path: Path) -> None:
    def setup(module: pl.LightningModule) -> None:
        def configure_optimizers() -> dict[str, Any]:
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            step = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": step, "interval": "step", "frequency": 2}}
        module.configure_optimizers = configure_optimizers  # type: ignore[method-assign]

    lean, _ = _both(tmp_path, module_setup=setup)
    assert sum(hook == "lr_scheduler_step" for _, hook, _ in lean["seen"]) == STEPS // 2
    assert lean["lean_batches"] == STEPS


def test_an_epoch_scheduler_is_stepped_at_the_epochs_last_batch_as_lightning_steps_it(tmp_path: Path) -> None:
    def setup(module: pl.LightningModule) -> None:
        def configure_optimizers() -> dict[str, Any]:
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            step = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": step, "interval": "epoch"}}
        module.configure_optimizers = configure_optimizers  # type: ignore[method-assign]

    lean, _ = _both(tmp_path, module_setup=setup, train=loader(6, 2), max_epochs=2, max_steps=-1)
    assert sum(hook == "lr_scheduler_step" for _, hook, _ in lean["seen"]) == 2


def test_an_epoch_mean_weights_each_batch_by_its_size_as_lightnings_does(tmp_path: Path) -> None:
    """Lightning reads a batch's size from the batch the loop hands its results."""
    def setup(module: pl.LightningModule) -> None:
        traced = module.training_step

        def training_step(batch: Any, batch_idx: int) -> Any:
            loss = traced(batch, batch_idx)
            module.log("per_row", batch["input_ids"].float().mean(), on_step=False, on_epoch=True)
            return loss
        module.training_step = training_step  # type: ignore[method-assign]

    rows = list(loader(12, 1))
    batches = [{k: torch.cat([r[k] for r in rows[a:b]]) for k in rows[0]} for a, b in ((0, 1), (1, 4), (4, 6))]
    lean, _ = _both(tmp_path, module_setup=setup, train=DataLoader(batches, batch_size=None), max_epochs=2,
                    max_steps=-1, steps=6)
    assert sum("per_row" in row for _, row in lean["rows"]) == 2


class StopsAtStep(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *a: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


def test_a_fit_a_callback_stops_ends_as_lightnings_does(tmp_path: Path) -> None:
    """A stop request validates at once, writes the step's metrics and ends the fit."""
    def setup(module: pl.LightningModule) -> None:
        traced = module.training_step

        def training_step(batch: Any, batch_idx: int) -> Any:
            module.log("batch_idx", float(batch_idx), on_step=True, on_epoch=False)
            return traced(batch, batch_idx)
        module.training_step = training_step  # type: ignore[method-assign]

    lean, _ = _both(tmp_path, module_setup=setup, callbacks=(StopsAtStep(4),), log_every_n_steps=5, steps=4)
    assert [row["batch_idx"] for _, row in lean["rows"] if "batch_idx" in row] == [3.0]


class Sigterm(pl.Callback):
    """Flags a SIGTERM at the end of step 4 (as Lightning's handler flags it) and records the
    step the fit stopped at."""

    def __init__(self) -> None:
        self.stopped_at: int | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *a: Any) -> None:
        if trainer.global_step == 4:
            trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: pl.Trainer, module: pl.LightningModule, exception: BaseException) -> None:
        self.stopped_at = trainer.global_step


def test_a_sigterm_ends_the_fit_after_its_batch_as_lightnings_does(tmp_path: Path) -> None:
    stopped = {}
    for lean in (True, False):
        sigterm = Sigterm()
        with pytest.raises(SIGTERMException):
            _run(tmp_path / str(lean), lean, callbacks=(sigterm,))
        stopped[lean] = sigterm.stopped_at
    assert stopped[True] == stopped[False] == 4


class AddsACallback(pl.Callback):
    """Adds ``late`` to the trainer's callbacks at the end of the second batch."""

    def __init__(self, late: pl.Callback) -> None:
        self.late = late

    def on_train_batch_end(self, trainer: pl.Trainer, *a: Any) -> None:
        if trainer.global_step == 2:
            trainer.callbacks.append(self.late)


class Late(pl.Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_before_backward(self, trainer: pl.Trainer, *a: Any) -> None:
        self.steps.append(trainer.global_step)


def test_a_callback_added_during_the_fit_is_called_from_the_next_batch(tmp_path: Path) -> None:
    got = {}
    for lean in (True, False):
        late = Late()
        _run(tmp_path / str(lean), lean, callbacks=(AddsACallback(late),))
        got[lean] = late.steps
    assert got[True] == got[False] == [2, 3, 4, 5]


def test_a_resumed_fit_ends_where_lightnings_does(tmp_path: Path) -> None:
    """The first batch after a restart takes Lightning's path (it checks the restart), the rest
    the lean one; both end on the same state and weights."""
    first = tmp_path / "first"
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=first, every_n_train_steps=2, save_top_k=-1)
    _run(first, True, callbacks=(ckpt,), max_steps=4, enable_checkpointing=True)
    path = str(first / "epoch=0-step=2.ckpt")
    lean, _ = _both(tmp_path, ckpt_path=path)
    assert lean["lean_batches"] == STEPS - 2 - 1


def test_checkpoints_are_written_at_the_steps_lightnings_are(tmp_path: Path) -> None:
    """A checkpoint that saves every 2 steps keeps its per-batch test in the plan; one that saves
    at validation (the platform's default) has nothing to do per batch and is left out."""
    written = {}
    for lean in (True, False):
        at_val = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / f"val{lean}", save_top_k=-1, filename="{step}")
        every_2 = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / f"two{lean}", every_n_train_steps=2,
                                               save_top_k=-1, filename="{step}")
        run = _run(tmp_path / str(lean), lean, callbacks=(at_val, every_2), enable_checkpointing=True)
        written[lean] = [sorted(p.name for p in (tmp_path / f"{d}{lean}").iterdir()) for d in ("val", "two")]
    assert written[True] == written[False] == [["step=3.ckpt", "step=6.ckpt"], ["step=2.ckpt", "step=4.ckpt", "step=6.ckpt"]]
    plan = HookPlan(run["trainer"])
    assert every_2.on_train_batch_end in plan.callbacks["on_train_batch_end"]
    assert at_val.on_train_batch_end not in plan.callbacks["on_train_batch_end"]


class Endless(torch.utils.data.IterableDataset):
    """An iterable with no length: Lightning cannot know an epoch's last batch in advance."""

    def __iter__(self) -> Any:
        while True:
            yield from loader(4, 2)


@pytest.mark.parametrize("schedule", [
    {"val_check_interval": 4, "check_val_every_n_epoch": None, "max_epochs": 3, "max_steps": 10},  # across epochs
    {"val_check_interval": 1.0, "limit_train_batches": 4, "endless": True},  # every limit_train_batches
    {"val_check_interval": 3, "check_val_every_n_epoch": None, "endless": True},
    {"val_check_interval": timedelta(seconds=0), "check_val_every_n_epoch": None},  # a time interval
], ids=["total_batches", "limit_train_batches", "endless", "time"])
def test_validation_runs_at_lightnings_batches(tmp_path: Path, schedule: dict[str, Any]) -> None:
    kw = dict(schedule)
    train = DataLoader(Endless(), batch_size=None) if kw.pop("endless", False) else loader(12, 2)
    lean, _ = _both(tmp_path, train=train, steps=kw.get("max_steps", STEPS), **kw)
    assert any(hook == "on_validation_start" for _, hook, _ in lean["seen"])


def test_accumulation_takes_lightnings_path(tmp_path: Path) -> None:
    run = _run(tmp_path, True, accumulate_grad_batches=2)
    assert run["lean_batches"] == 0


class Names(torch.nn.Module):
    """A module whose ``__setattr__`` the plan does not know: it must write names through it."""

    def __setattr__(self, name: str, value: Any) -> None:
        self.__dict__.setdefault("writes", []).append(name)
        super().__setattr__(name, value)


def _fitted(tmp_path: Path, module: pl.LightningModule) -> pl.Trainer:
    trainer = cpu_trainer(2, tmp_path, limit_val_batches=0)
    trainer.fit(module, loader(4, 2))
    return trainer


def test_the_plan_writes_the_hook_name_through_a_setattr_it_does_not_know(tmp_path: Path) -> None:
    plain = tiny_module(2)
    assert HookPlan(_fitted(tmp_path / "plain", plain)).names is plain.__dict__  # LMModule's is registered
    module = tiny_module(2)

    class Custom(Names, type(module)):  # type: ignore[misc]
        pass

    module.__class__ = Custom
    plan = HookPlan(_fitted(tmp_path / "custom", module))
    assert plan.names is not module.__dict__
    module.__dict__["writes"] = []
    plan.names[FX] = "on_train_batch_end"
    assert module._current_fx_name == "on_train_batch_end" and module.writes == [FX]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_every_batch_of_a_plain_fit_is_lean(tmp_path: Path, precision: str) -> None:
    lean, _ = _both(tmp_path, precision=precision, log_every_n_steps=2)
    assert lean["lean_batches"] == STEPS
    assert [step for step, _ in lean["rows"]] == [step for step, _ in _["rows"]]


def test_a_hook_replaced_between_two_fits_of_one_trainer_is_called_in_the_second(tmp_path: Path) -> None:
    calls: list[str] = []
    late = Late()
    module = tiny_module(4)
    trainer = cpu_trainer(2, tmp_path, callbacks=[late], limit_val_batches=0)
    trainer.fit(module, loader(8, 2))
    late.on_before_backward = lambda *a: calls.append("replaced")  # type: ignore[method-assign]
    trainer.fit_loop.epoch_loop.max_steps = 4
    trainer.fit(module, loader(8, 2))
    assert late.steps == [0, 1] and calls == ["replaced", "replaced"]
