"""A training batch and its automatic optimization without Lightning's pass-along layers, and a
CPU batch handed on without a transfer: the same hooks in the same order with the same
``_current_fx_name``, the same progress counters, logged values and weights as Lightning's own
path, which every other set-up still takes. ``_run`` switches all three shortcuts together;
tests/training/test_lean_batch.py holds the batch's own cases."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.core.optimizer import LightningOptimizer
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.profilers import SimpleProfiler
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from scalelab.training import lean_batch
from scalelab.training.lean_batch import lean_training_batch
from scalelab.training.lean_optimization import lean_automatic_optimization
from scalelab.training.lightning_fixes import remember_hook_signatures, skip_noop_batch_transfer

from .conftest import cpu_trainer
from .test_callbacks import loader, tiny_module
from .test_lightning_fixes import HOOKS, Recorder
from .test_step_logging import ListLogger

STEPS = 6
# module hooks a step may call, traced on the instance (optimizer_step is not: overriding it
# sends the step down Lightning's path)
TRACED = ("training_step", "on_train_batch_start", "on_before_zero_grad", "optimizer_zero_grad",
          "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
          "configure_gradient_clipping", "lr_scheduler_step", "on_train_batch_end")


def _trace_module(module: pl.LightningModule, seen: list[tuple[str, str, str | None]]) -> None:
    for hook in TRACED:
        def traced(*a: Any, _hook: str = hook, **k: Any) -> Any:
            seen.append(("module", _hook, module._current_fx_name))
            return getattr(type(module), _hook)(module, *a, **k)
        setattr(module, hook, traced)


class _Watched:
    """A train loader that records the module's ``_current_fx_name`` at each fetch: what the
    loop leaves set between its hooks."""

    def __init__(self, batches: Any, module: pl.LightningModule, seen: list[tuple[str, str, str | None]]) -> None:
        self.batches, self.module, self.seen = batches, module, seen

    def __iter__(self) -> Any:
        for batch in self.batches:
            self.seen.append(("loader", "next", self.module._current_fx_name))
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def _run(tmp_path: Path, lean: bool, skip_batch: int | None = None, optimizer: Any = None,
         module_setup: Any = None, train: Any = None, callbacks: tuple[Any, ...] = (), ckpt_path: str | None = None,
         **trainer_kw: Any) -> dict[str, Any]:
    """A short fit with every callback hook and the module's step hooks traced; ``lean`` picks
    scalelab's path or Lightning's for the three shortcuts. ``module_setup(module)`` changes the
    module after tracing; ``train`` replaces the train loader."""
    lean_automatic_optimization()
    skip_noop_batch_transfer()
    lean_training_batch()
    seen: list[tuple[str, str, str | None]] = []
    torch.manual_seed(0)
    module = tiny_module(STEPS)
    _trace_module(module, seen)
    if module_setup is not None:
        module_setup(module)
    if optimizer is not None:  # one built from the module's parameters, and no lr schedule
        module.configure_optimizers = lambda: optimizer(module.parameters())  # type: ignore[method-assign]
    if skip_batch is not None:  # training_step returns None on one batch: no backward then
        step = module.training_step
        # Lightning passes batch_idx to a training_step with a parameter of that name
        module.training_step = lambda b, batch_idx: None if batch_idx == skip_batch else step(b, batch_idx)  # type: ignore[method-assign]
    logger = ListLogger()
    train = _Watched(train if train is not None else loader(STEPS * 2, 2), module, seen)
    outputs: list[float] = []  # the loss each batch's step hands to on_train_batch_end
    output_keys: list[tuple[str, ...]] = []

    class Outputs(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, out: Any, *a: Any) -> None:
            outputs.append(float(out["loss"]) if out else float("nan"))
            output_keys.append(tuple(sorted(out or ())))

    trainer_kw = {"val_check_interval": 3, "limit_val_batches": 1, "gradient_clip_val": 0.05, **trainer_kw}
    trainer = cpu_trainer(trainer_kw.pop("max_steps", STEPS), tmp_path, callbacks=[Recorder(seen), Outputs(), *callbacks],
                          logger=logger, **trainer_kw)
    fast_run = _AutomaticOptimization.run
    fast_transfer = pl.LightningModule._apply_batch_transfer_handler
    fast_advance, fast_end = _TrainingEpochLoop.advance, _TrainingEpochLoop.on_advance_end
    steps: list[int] = []
    lean_batches: list[int] = []
    original_step = LightningOptimizer.step
    original_advance = lean_batch._advance

    def counted_advance(*a: Any) -> Any:
        lean_batches.append(1)
        return original_advance(*a)

    def counted_step(self: LightningOptimizer, *a: Any, **k: Any) -> Any:
        steps.append(1)
        return original_step(self, *a, **k)

    if not lean:
        _AutomaticOptimization.run = fast_run.__wrapped__  # type: ignore[method-assign]
        pl.LightningModule._apply_batch_transfer_handler = fast_transfer.__wrapped__  # type: ignore[method-assign]
        _TrainingEpochLoop.advance = fast_advance.__wrapped__  # type: ignore[method-assign]
        _TrainingEpochLoop.on_advance_end = fast_end.__wrapped__  # type: ignore[method-assign]
    LightningOptimizer.step = counted_step  # type: ignore[method-assign]
    lean_batch._advance = counted_advance
    try:
        trainer.fit(module, train, loader(2, 2), ckpt_path=ckpt_path)
    finally:
        _AutomaticOptimization.run = fast_run  # type: ignore[method-assign]
        pl.LightningModule._apply_batch_transfer_handler = fast_transfer  # type: ignore[method-assign]
        _TrainingEpochLoop.advance, _TrainingEpochLoop.on_advance_end = fast_advance, fast_end  # type: ignore[method-assign]
        LightningOptimizer.step = original_step  # type: ignore[method-assign]
        lean_batch._advance = original_advance
    return {"seen": seen, "loop": trainer.fit_loop.state_dict(), "rows": logger.rows, "outputs": outputs,
            "output_keys": output_keys,
            "weights": {k: v.clone() for k, v in module.state_dict().items()},
            "lightning_optimizer_steps": len(steps), "global_step": trainer.global_step,
            "lean_batches": len(lean_batches), "trainer": trainer}


def _same_run(a: dict[str, Any], b: dict[str, Any], steps: int = STEPS) -> None:
    assert a["seen"] == b["seen"]
    assert a["loop"] == b["loop"]
    assert a["rows"] == b["rows"]
    assert a["outputs"] == pytest.approx(b["outputs"], nan_ok=True, rel=0, abs=0)
    assert a["output_keys"] == b["output_keys"]
    assert a["global_step"] == b["global_step"] == steps
    assert a["weights"].keys() == b["weights"].keys()
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_step_makes_lightnings_calls_and_ends_on_its_weights(tmp_path: Path, precision: str) -> None:
    lean = _run(tmp_path / "lean", True, precision=precision)
    lightning = _run(tmp_path / "lightning", False, precision=precision)
    _same_run(lean, lightning)
    assert lean["lightning_optimizer_steps"] == 0  # the layers were skipped
    assert lightning["lightning_optimizer_steps"] == STEPS
    assert (lean["lean_batches"], lightning["lean_batches"]) == (STEPS, 0)
    hooks = {hook for _, hook, _ in lean["seen"]}
    assert set(TRACED) <= hooks and {"on_before_backward", "on_before_optimizer_step"} <= hooks & set(HOOKS)
    assert ("module", "backward", "backward") in lean["seen"]
    assert ("module", "configure_gradient_clipping", "configure_gradient_clipping") in lean["seen"]


def test_a_step_whose_training_step_returns_none_is_skipped_as_lightning_skips_it(tmp_path: Path) -> None:
    lean = _run(tmp_path / "lean", True, skip_batch=2)
    lightning = _run(tmp_path / "lightning", False, skip_batch=2)
    _same_run(lean, lightning)
    assert sum(hook == "backward" for _, hook, _ in lean["seen"]) == STEPS - 1


def test_a_training_step_that_returns_a_dict_hands_on_its_other_keys_as_lightning_does(tmp_path: Path) -> None:
    def returns_dict(module: pl.LightningModule) -> None:
        step = module.training_step
        module.training_step = lambda b, batch_idx: {  # type: ignore[method-assign]
            "loss": (loss := step(b, batch_idx)), "twice": 2 * loss.detach()}

    lean = _run(tmp_path / "lean", True, module_setup=returns_dict)
    lightning = _run(tmp_path / "lightning", False, module_setup=returns_dict)
    _same_run(lean, lightning)
    assert lean["output_keys"] == [("loss", "twice")] * STEPS


def test_the_backward_hooks_get_the_very_loss_training_step_returned(tmp_path: Path) -> None:
    # Lightning divides it by accumulate_grad_batches, 1 here: a kernel and a backward node.
    returned: list[torch.Tensor] = []
    given: list[torch.Tensor] = []

    def watch(module: pl.LightningModule) -> None:
        step = module.training_step
        module.training_step = lambda b, batch_idx: (returned.append(step(b, batch_idx)), returned[-1])[1]  # type: ignore[method-assign]
        module.on_before_backward = given.append  # type: ignore[method-assign]

    _run(tmp_path, True, module_setup=watch)
    assert len(given) == len(returned) == STEPS and all(map(operator.is_, given, returned))


def test_an_optimizer_that_runs_the_closure_several_times_sees_lightnings_calls(tmp_path: Path) -> None:
    def lbfgs(params: Any) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(params, lr=0.1, max_iter=3)

    lean = _run(tmp_path / "lean", True, optimizer=lbfgs)
    lightning = _run(tmp_path / "lightning", False, optimizer=lbfgs)
    _same_run(lean, lightning)
    assert sum(hook == "training_step" for _, hook, _ in lean["seen"]) > STEPS  # the closure ran again


class SkipsTheClosure(torch.optim.SGD):
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None


def test_an_optimizer_that_skips_the_closure_is_refused_as_lightning_refuses_it(tmp_path: Path) -> None:
    for lean in (True, False):
        with pytest.raises(MisconfigurationException, match="closure hasn't been executed"):
            _run(tmp_path / str(lean), lean, optimizer=lambda p: SkipsTheClosure(p, lr=0.1))


@pytest.mark.parametrize("kw", [{"accumulate_grad_batches": 2}, {"profiler": "simple"}], ids=["accumulation", "profiler"])
def test_other_set_ups_take_lightnings_path(tmp_path: Path, kw: dict[str, Any]) -> None:
    if kw.get("profiler"):
        kw = {"profiler": SimpleProfiler()}
    run = _run(tmp_path, True, **kw)
    assert run["lightning_optimizer_steps"] == STEPS


def test_an_overridden_optimizer_step_is_called(tmp_path: Path) -> None:
    lean_automatic_optimization()
    module, calls = tiny_module(2), []

    def optimizer_step(*a: Any, **k: Any) -> None:
        calls.append(1)
        pl.LightningModule.optimizer_step(module, *a, **k)

    module.optimizer_step = optimizer_step  # type: ignore[method-assign]
    cpu_trainer(2, tmp_path, limit_val_batches=0).fit(module, loader(4, 2))
    assert len(calls) == 2


def test_a_cpu_batch_reaches_the_step_as_the_loader_made_it(tmp_path: Path) -> None:
    skip_noop_batch_transfer()
    made: list[Any] = []
    got: list[Any] = []

    class Loader(torch.utils.data.DataLoader):
        def __iter__(self) -> Any:
            for b in super().__iter__():
                made.append(b)
                yield b

    module = tiny_module(2)
    step = module.training_step
    module.training_step = lambda b, batch_idx: (got.append(b), step(b, batch_idx))[1]  # type: ignore[method-assign]
    source = loader(4, 2)
    cpu_trainer(2, tmp_path, limit_val_batches=0).fit(module, Loader(source.dataset, batch_size=2))
    assert len(got) == 2 and all(g is m for g, m in zip(got, made, strict=False))


@pytest.mark.parametrize("owner", ["module", "datamodule"])
def test_a_transfer_hook_someone_overrides_is_called(tmp_path: Path, owner: str) -> None:
    skip_noop_batch_transfer()
    calls: list[str] = []

    class Data(pl.LightningDataModule):
        def train_dataloader(self) -> Any:
            return loader(4, 2)

    module, data = tiny_module(2), Data()
    target = module if owner == "module" else data
    target.on_after_batch_transfer = lambda b, i: (calls.append(owner), b)[1]  # type: ignore[method-assign]
    cpu_trainer(2, tmp_path, limit_val_batches=0).fit(module, datamodule=data)
    assert calls == [owner, owner]


def test_applying_the_shortcuts_twice_wraps_once() -> None:
    lean_automatic_optimization()
    skip_noop_batch_transfer()
    first = _AutomaticOptimization.run, pl.LightningModule._apply_batch_transfer_handler
    lean_automatic_optimization()
    skip_noop_batch_transfer()
    assert (_AutomaticOptimization.run, pl.LightningModule._apply_batch_transfer_handler) == first


@pytest.mark.parametrize("takes_batch_idx", [True, False])
def test_batch_idx_is_passed_as_the_training_step_asks(tmp_path: Path, takes_batch_idx: bool) -> None:
    remember_hook_signatures()
    module, got = tiny_module(3), []
    step = module.training_step
    if takes_batch_idx:
        module.training_step = lambda batch, batch_idx: (got.append(batch_idx), step(batch, batch_idx))[1]  # type: ignore[method-assign]
    else:
        module.training_step = lambda batch: (got.append(None), step(batch, 0))[1]  # type: ignore[method-assign]
    trainer = cpu_trainer(2, tmp_path, limit_val_batches=0)
    trainer.fit(module, loader(4, 2))
    assert got == ([0, 1] if takes_batch_idx else [None, None])
    # the same module with another training_step: asked again
    module.training_step = lambda batch: (got.append("again"), step(batch, 0))[1]  # type: ignore[method-assign]
    cpu_trainer(3, tmp_path / "b", limit_val_batches=0).fit(module, loader(6, 2))
    assert got[-1] == "again"


def test_the_train_stream_hands_on_its_batches_as_made(shakespeare_char: Any) -> None:
    """No copy of each batch dict between the stream and the step (DataLoader's default collate
    for ``batch_size=None`` made one)."""
    from scalelab.data.datamodules import CausalLMDataModule

    dm = CausalLMDataModule(shakespeare_char, block_size=16, batch_size=3, seed=1)
    dm.setup("fit")
    batches = dm.train_dataloader()
    made: dict[int, Any] = {}
    make = dm._train_ds.make
    dm._train_ds.make = lambda k: made.setdefault(k, make(k))
    got = [b for _, b in zip(range(3), batches, strict=False)]
    assert len(made) >= 3 and all(b is made[k] for k, b in enumerate(got))
