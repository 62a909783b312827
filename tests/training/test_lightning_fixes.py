"""The shortcuts for Lightning's per-step costs: the per-log device walk skips only moves that
move nothing, and what Lightning logs and reduces stays the same; the callback dispatch skips
only hooks no callback defines, and every callback sees what it saw before; the per-batch metric
gather is skipped only when it would write what the dicts hold already."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.profilers import SimpleProfiler
from pytorch_lightning.trainer import call
from pytorch_lightning.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from pytorch_lightning.trainer.connectors.logger_connector.result import (
    _Metadata,
    _ResultCollection,
    _ResultMetric,
)

from scalelab.training.lightning_fixes import (
    _does_nothing,
    find_training_results_directly,
    remember_hook_signatures,
    skip_empty_module_hooks,
    skip_inherited_callback_hooks,
    skip_noop_result_moves,
    skip_unchanged_step_metrics,
)

from .conftest import cpu_trainer, lightnings_batch
from .test_callbacks import loader, tiny_module
from .test_step_logging import ListLogger


def holder() -> _ResultMetric:
    meta = _Metadata(fx="training_step", name="x", on_step=True, on_epoch=True)
    return _ResultMetric(meta, True)


def test_a_move_to_the_device_the_holder_is_on_returns_it_untouched() -> None:
    skip_noop_result_moves()
    m = holder()
    meta, value = m.meta, m.value
    assert m.to(torch.device("cpu")) is m and m.to("cpu") is m
    assert m.meta is meta and m.value is value  # no walk: nothing copied
    # the original walks and deep-copies the metadata: what the shortcut saves on every log
    original = _ResultMetric.to.__wrapped__
    original(m, torch.device("cpu"))
    assert m.meta is not meta and m.meta == meta


def test_other_moves_still_take_the_original_path() -> None:
    skip_noop_result_moves()
    m = holder()
    m.to(torch.float64)  # a cast, not a device
    assert m.value.dtype == torch.float64
    m.to("meta")  # another device: everything moves, the reset defaults included
    assert m.value.device.type == "meta" and m.cumulated_batch_size.device.type == "meta"
    assert all(t.device.type == "meta" for t in m._defaults.values())


def test_applying_it_twice_wraps_once() -> None:
    skip_noop_result_moves()
    first = _ResultMetric.to
    skip_noop_result_moves()
    assert _ResultMetric.to is first
    assert not hasattr(first.__wrapped__, "__wrapped__")


def test_logged_step_values_and_epoch_means_are_unchanged() -> None:
    """With the shortcut on (building the module applies it), Lightning still logs each
    step's value and reduces the epoch mean weighted by batch size."""
    steps = 6
    module = tiny_module(steps)
    assert hasattr(_ResultMetric.to, "__wrapped__")
    seen: list[float] = []

    def training_step(batch: Any, batch_idx: int) -> torch.Tensor:
        loss = type(module).training_step(module, batch, batch_idx)
        value = float(batch_idx + 1)
        seen.append(value)
        module.log("probe", torch.tensor(value), on_step=True, on_epoch=True,
                   batch_size=batch_idx + 1)
        return loss

    module.training_step = training_step  # type: ignore[method-assign]
    logger = ListLogger()
    trainer = cpu_trainer(steps, logger=logger, log_every_n_steps=1, limit_val_batches=0,
                          limit_train_batches=steps)
    trainer.fit(module, loader(steps * 2, 2))
    per_step = [m["probe_step"] for _, m in logger.rows if "probe_step" in m]
    assert per_step == seen == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    weighted = sum(v * v for v in seen) / sum(seen)  # value k has batch size k
    epoch = [m["probe_epoch"] for _, m in logger.rows if "probe_epoch" in m]
    assert epoch == [pytest.approx(weighted)]


# --- callback hooks: only the ones a callback defines are called ---------------------------
HOOKS = [name for name in vars(pl.Callback) if name.startswith("on_") or name in ("setup", "teardown")]


class Recorder(pl.Callback):
    """Defines every hook of ``Callback`` and records (hook, the module's _current_fx_name)."""

    def __init__(self, seen: list[tuple[str, str, str | None]]) -> None:
        self.seen = seen


def _recording(hook: str) -> Any:
    def record(self: Recorder, trainer: pl.Trainer, module: pl.LightningModule, *a: Any, **k: Any) -> None:
        self.seen.append(("rec", hook, getattr(module, "_current_fx_name", None)))
    return record


for _hook in HOOKS:
    setattr(Recorder, _hook, _recording(_hook))


class OneHook(pl.Callback):
    def __init__(self, seen: list[tuple[str, str, str | None]]) -> None:
        self.seen = seen

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *a: Any) -> None:
        self.seen.append(("one", "on_train_batch_end", module._current_fx_name))


def _hook_trace(tmp_path: Path, dispatch: Any) -> list[tuple[str, str, str | None]]:
    seen: list[tuple[str, str, str | None]] = []
    # hooks defined in a class body (OneHook), set on a class (Recorder) and on an instance
    on_instance = pl.Callback()
    on_instance.on_before_zero_grad = lambda tr, m, opt: seen.append(  # type: ignore[method-assign]
        ("instance", "on_before_zero_grad", m._current_fx_name))
    steps = 4
    torch.manual_seed(0)
    module = tiny_module(steps)  # built before the swap: building it applies the fix
    trainer = cpu_trainer(steps, tmp_path, callbacks=[Recorder(seen), OneHook(seen), on_instance,
                                                      ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=2)],
                          enable_checkpointing=True, val_check_interval=2, limit_val_batches=1)
    saved = call._call_callback_hooks
    call._call_callback_hooks = dispatch
    try:
        with lightnings_batch():
            trainer.fit(module, loader(steps * 2, 2), loader(2, 2))
    finally:
        call._call_callback_hooks = saved
    return seen


def test_callbacks_see_the_same_hooks_in_the_same_order_as_with_lightnings_dispatch(tmp_path: Path) -> None:
    skip_inherited_callback_hooks()
    fast = call._call_callback_hooks
    assert getattr(fast, "__wrapped__", None) is not None
    with_fix = _hook_trace(tmp_path / "a", fast)
    original = _hook_trace(tmp_path / "b", fast.__wrapped__)
    assert with_fix == original
    names = {(who, hook) for who, hook, _ in with_fix}
    assert ("one", "on_train_batch_end") in names and ("instance", "on_before_zero_grad") in names
    assert {("rec", hook) for hook in ("setup", "on_train_batch_start", "on_before_backward",
                                       "on_validation_end", "on_save_checkpoint", "teardown")} <= names
    assert all(fx == hook for who, hook, fx in with_fix if who == "one")


def test_an_inherited_empty_hook_is_not_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Callback's own on_before_backward, counted: Lightning's dispatch calls it on every
    callback at every step; the fix calls it on none."""
    skip_inherited_callback_hooks()
    calls: list[str] = []

    def counted(self: pl.Callback, *a: Any) -> None:
        calls.append(type(self).__name__)

    monkeypatch.setattr(pl.Callback, "on_before_backward", counted)
    _hook_trace(tmp_path / "a", call._call_callback_hooks)
    assert calls.count("OneHook") == 0
    _hook_trace(tmp_path / "b", call._call_callback_hooks.__wrapped__)
    assert calls.count("OneHook") == 4  # what the fix saves: one call a step per callback


def test_a_real_profiler_takes_lightnings_path_and_keeps_its_records(tmp_path: Path) -> None:
    skip_inherited_callback_hooks()
    profiler = SimpleProfiler()
    trainer = cpu_trainer(2, tmp_path, callbacks=[OneHook([])], profiler=profiler, limit_val_batches=0)
    trainer.fit(tiny_module(2), loader(4, 2))
    assert any(k.startswith("[Callback]OneHook.on_train_batch_end") for k in profiler.recorded_durations)


def test_skipping_hooks_applied_twice_wraps_once() -> None:
    skip_inherited_callback_hooks()
    first = call._call_callback_hooks
    skip_inherited_callback_hooks()
    assert call._call_callback_hooks is first


def test_the_modules_step_counters_stay_plain_attributes() -> None:
    """LMModule writes its per-step attributes past nn.Module's registry: they must never end
    up as buffers or in the state dict, and reads see the writes."""
    module = tiny_module(2)
    keys = set(module.state_dict())
    module._win_loss = torch.tensor(1.5)
    module.tokens_seen = 7
    module._current_fx_name = "training_step"
    assert "_win_loss" not in module._buffers and set(module.state_dict()) == keys
    assert float(module._win_loss) == 1.5 and module.tokens_seen == 7
    assert module._current_fx_name == "training_step"


# --- the per-batch metric gather: only when something changed since the last one -----------
Dicts = tuple[dict[str, float], ...]


class MetricDicts(pl.Callback):
    """What the logger connector's three metric dicts hold at each batch start (what the
    previous batch end left there), after each validation and at the end."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, Dicts]] = []

    def _note(self, trainer: pl.Trainer, when: str) -> None:
        c = trainer._logger_connector
        dicts = (c._progress_bar_metrics, c._callback_metrics, c._logged_metrics)
        self.rows.append((when, tuple({k: float(v) for k, v in d.items()} for d in dicts)))

    def on_train_batch_start(self, trainer: pl.Trainer, module: pl.LightningModule, *a: Any) -> None:
        self._note(trainer, f"batch {trainer.global_step}")

    def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._note(trainer, "validation")

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self._note(trainer, "end")


def _log_probe_in_train_and_val(module: Any) -> None:
    """Log "probe" from both loops: the validation's epoch value overwrites the train step's
    (logged at the first two steps only) in the callback dict, and Lightning's next train batch
    end writes the train value back, though nothing new was logged."""
    def training_step(batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx < 2:
            module.log("probe", float(batch_idx), on_step=True, on_epoch=False, prog_bar=True)
        return type(module).training_step(module, batch, batch_idx)

    def validation_step(batch: Any, batch_idx: int) -> None:
        module.log("probe", -1.0, on_step=False, on_epoch=True, prog_bar=True)
        type(module).validation_step(module, batch, batch_idx)

    module.training_step, module.validation_step = training_step, validation_step


def _metric_trace(tmp_path: Path, on_batch_end: Any, probe: bool = False
                  ) -> tuple[list[tuple[str, Dicts]], int, int]:
    """(the dicts over a run that logs every 3rd of 9 steps and validates every 4th, gathers
    made at batch ends, .item() calls in the run)."""
    counts = {"gathers": 0, "items": 0}
    gather, item = _ResultCollection.metrics, torch.Tensor.item

    def counted_gather(self: _ResultCollection, on_step: bool) -> Any:
        counts["gathers"] += on_step and self.training
        return gather(self, on_step)

    def counted_item(self: torch.Tensor) -> Any:
        counts["items"] += 1
        return item(self)

    steps = 9
    torch.manual_seed(0)
    module = tiny_module(steps)  # building it applies the fix
    if probe:
        _log_probe_in_train_and_val(module)
    recorder = MetricDicts()
    trainer = cpu_trainer(steps, tmp_path, callbacks=[recorder], log_every_n_steps=3,
                          logger=ListLogger(), val_check_interval=4, limit_val_batches=1)
    saved = _LoggerConnector.on_batch_end
    _LoggerConnector.on_batch_end = on_batch_end  # type: ignore[method-assign]
    _ResultCollection.metrics = counted_gather  # type: ignore[method-assign]
    torch.Tensor.item = counted_item  # type: ignore[method-assign]
    try:
        trainer.fit(module, loader(steps * 2, 2), loader(2, 2))
    finally:
        _LoggerConnector.on_batch_end = saved  # type: ignore[method-assign]
        _ResultCollection.metrics = gather  # type: ignore[method-assign]
        torch.Tensor.item = item  # type: ignore[method-assign]
    return recorder.rows, counts["gathers"], counts["items"]


def test_the_metric_dicts_read_the_same_with_and_without_the_gather_shortcut(tmp_path: Path) -> None:
    skip_unchanged_step_metrics()
    fast = _LoggerConnector.on_batch_end
    assert getattr(fast, "__wrapped__", None) is not None
    rows, gathers, items = _metric_trace(tmp_path / "a", fast)
    rows0, gathers0, items0 = _metric_trace(tmp_path / "b", fast.__wrapped__)
    assert rows == rows0
    pbar, callback, logged = dict(rows)["end"]
    assert {"train/loss", "lr", "val/loss"} <= set(callback) and "train/loss" in pbar and "lr" in logged
    # Lightning gathers after every batch (9) and for log_metrics at the 3 logging steps; with
    # the fix the batch end gathers only at the first batch and at the 3 that logged
    assert (gathers0, gathers) == (9 + 3, 1 + 3 + 3)
    # the skipped gathers after the first log (4) each made one .item() for the progress-bar
    # value train/loss: a device sync on a GPU
    assert items0 - items == 4


def test_a_name_both_loops_log_reads_as_without_the_gather_shortcut(tmp_path: Path) -> None:
    skip_unchanged_step_metrics()
    fast = _LoggerConnector.on_batch_end
    rows = _metric_trace(tmp_path / "a", fast, probe=True)[0]
    assert rows == _metric_trace(tmp_path / "b", fast.__wrapped__, probe=True)[0]
    whens = [when for when, _ in rows]
    assert whens[whens.index("validation") + 1:][:2] == ["batch 4", "batch 5"]
    pbar, callback, _ = dict(rows)["batch 5"]  # after batch 4's end
    assert callback["probe"] == pbar["probe"] == 1.0


def test_the_gather_shortcut_applied_twice_wraps_once() -> None:
    skip_unchanged_step_metrics()
    first = _LoggerConnector.on_batch_end
    skip_unchanged_step_metrics()
    assert _LoggerConnector.on_batch_end is first


# --- LightningModule and Strategy hooks: no profiler context, empty module hooks skipped ----
MODULE_HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_zero_grad",
                "on_train_batch_end", "on_validation_batch_end", "on_train_epoch_end")


def _module_hook_trace(tmp_path: Path, module_hook: Any, strategy_hook: Any) -> list[tuple[str, str | None]]:
    """(hook, the module's _current_fx_name inside it) for hooks set on the module and for its
    training and validation steps, which Lightning calls through the strategy."""
    seen: list[tuple[str, str | None]] = []
    steps = 4
    torch.manual_seed(0)
    module = tiny_module(steps)  # building it applies the fix
    for hook in MODULE_HOOKS:
        setattr(module, hook, lambda *a, _hook=hook, **k: seen.append((_hook, module._current_fx_name)))
    for step in ("training_step", "validation_step"):
        def traced(batch: Any, batch_idx: int, _step: str = step) -> Any:
            seen.append((_step, module._current_fx_name))
            return getattr(type(module), _step)(module, batch, batch_idx)
        setattr(module, step, traced)
    trainer = cpu_trainer(steps, tmp_path, val_check_interval=2, limit_val_batches=1)
    saved = call._call_lightning_module_hook, call._call_strategy_hook
    call._call_lightning_module_hook, call._call_strategy_hook = module_hook, strategy_hook
    try:
        with lightnings_batch():
            trainer.fit(module, loader(steps * 2, 2), loader(2, 2))
    finally:
        call._call_lightning_module_hook, call._call_strategy_hook = saved
    return seen


def test_module_and_strategy_hooks_run_as_with_lightnings_calls(tmp_path: Path) -> None:
    skip_empty_module_hooks()
    fast_module, fast_strategy = call._call_lightning_module_hook, call._call_strategy_hook
    with_fix = _module_hook_trace(tmp_path / "a", fast_module, fast_strategy)
    original = _module_hook_trace(tmp_path / "b", fast_module.__wrapped__, fast_strategy.__wrapped__)
    assert with_fix == original
    assert {hook for hook, _ in with_fix} == {*MODULE_HOOKS, "training_step", "validation_step"}
    assert all(fx == hook for hook, fx in with_fix)


def test_only_hooks_that_do_nothing_count_as_empty() -> None:
    def documented_pass(self: Any) -> None:
        """A docstring and pass."""

    def returns_something(self: Any) -> int:
        return 1

    assert _does_nothing(pl.LightningModule.on_before_backward) and _does_nothing(documented_pass)
    assert _does_nothing(pl.LightningModule.on_train_batch_start)
    assert not _does_nothing(returns_something)
    # the defaults that do something are called
    for hook in ("backward", "optimizer_zero_grad", "lr_scheduler_step", "optimizer_step",
                 "configure_gradient_clipping", "training_step"):
        assert not _does_nothing(getattr(pl.LightningModule, hook)), hook


class UnhashableHook:
    """A callable hook whose class defines __eq__ only, so its instances do not hash."""

    def __init__(self) -> None:
        self.calls = 0

    def __eq__(self, other: object) -> bool:
        return self is other

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1


def test_a_hook_may_be_any_callable(tmp_path: Path) -> None:
    skip_empty_module_hooks()
    module, hook = tiny_module(2), UnhashableHook()
    module.on_train_batch_start = hook  # type: ignore[method-assign]
    cpu_trainer(2, tmp_path, limit_val_batches=0).fit(module, loader(4, 2))
    assert hook.calls == 2
    assert not _does_nothing(hook) and _does_nothing(module.on_before_backward)


def test_a_real_profiler_still_records_module_hooks(tmp_path: Path) -> None:
    skip_empty_module_hooks()
    profiler = SimpleProfiler()
    trainer = cpu_trainer(2, tmp_path, profiler=profiler, limit_val_batches=0)
    trainer.fit(tiny_module(2), loader(4, 2))
    assert any(k.startswith("[LightningModule]CausalLM.on_train_batch_start") for k in profiler.recorded_durations)
    assert any(k.startswith("[Strategy]SingleDeviceStrategy.training_step") for k in profiler.recorded_durations)


def test_skipping_module_hooks_applied_twice_wraps_once() -> None:
    skip_empty_module_hooks()
    first = call._call_lightning_module_hook, call._call_strategy_hook
    skip_empty_module_hooks()
    assert (call._call_lightning_module_hook, call._call_strategy_hook) == first


def test_remembered_signatures_answer_as_lightnings_test_and_read_each_function_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    from pytorch_lightning.core import module as lightning_module
    from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature

    remember_hook_signatures()
    remembered = lightning_module.is_param_in_hook_signature

    def step(self: Any, batch: Any, batch_idx: int) -> None: ...

    def takes_iter(self: Any, dataloader_iter: Any) -> None: ...

    # functions made here, so no earlier test has asked about them; a bound method among them
    hooks = [types.MethodType(step, object()), takes_iter, lambda self, *rest: None, lambda self: None]
    questions = [("dataloader_iter", True, None), ("batch_idx", False, 2), ("dataloader_idx", False, None)]
    reads: list[Any] = []
    getfullargspec = inspect.getfullargspec
    monkeypatch.setattr(inspect, "getfullargspec", lambda fn: (reads.append(fn), getfullargspec(fn))[1])
    for _ in range(3):
        for hook in hooks:
            for q in questions:
                assert remembered(hook, *q) == is_param_in_hook_signature(hook, *q), (hook, q)
    # Lightning's own test read each signature 3 x 12 times; the remembered one, once per question
    assert len(reads) == 3 * len(hooks) * len(questions) + len(hooks) * len(questions)


def test_logging_without_batch_size_from_a_dataloader_iter_step_is_still_refused(tmp_path: Path) -> None:
    remember_hook_signatures()
    module = tiny_module(2)

    class IterStep(type(module)):  # type: ignore[misc]
        def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
            batch, batch_idx, _ = next(dataloader_iter)
            self.log("x", 1.0)
            return super().training_step(batch, batch_idx)

    module.__class__ = IterStep
    with pytest.raises(Exception, match=r"`self.log\(..., batch_size=...\)` should be provided"):
        cpu_trainer(2, tmp_path, limit_val_batches=0).fit(module, loader(4, 2))


class _ResultsWatch(pl.Callback):
    """Records, in each stage, whether ``trainer._results`` is what Lightning's property gives."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def _check(self, trainer: pl.Trainer, where: str) -> None:
        lightnings = type(trainer)._results.fget.__wrapped__(trainer)
        self.seen.append((where, trainer._results is lightnings and lightnings is not None))

    def on_train_batch_end(self, trainer: pl.Trainer, *a: Any) -> None:
        self._check(trainer, "train")

    def on_validation_batch_end(self, trainer: pl.Trainer, *a: Any) -> None:
        self._check(trainer, "validate")


def test_the_trainers_results_are_lightnings_in_every_stage(tmp_path: Path) -> None:
    find_training_results_directly()
    watch = _ResultsWatch()
    trainer = cpu_trainer(4, tmp_path, callbacks=[watch], val_check_interval=2, limit_val_batches=1)
    module = tiny_module(4)
    trainer.fit(module, loader(8, 2), loader(2, 2))
    trainer.validate(module, loader(2, 2))
    assert {where for where, _ in watch.seen} == {"train", "validate"}
    assert all(same for _, same in watch.seen)
    assert trainer._results is None  # outside any loop, as Lightning's
