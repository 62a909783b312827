"""Fixes for Lightning's per-step costs, kept here until Lightning ships its own.

1. ``skip_noop_result_moves``: every ``self.log`` call moves the value's result holder to the
   value's device, and ``_ResultMetric.to`` walks its whole ``__dict__`` with
   ``apply_to_collection``, deep-copying the metadata dataclasses, even when the holder is
   already there (Lightning-AI/pytorch-lightning#20388; the same shortcut is proposed upstream
   in #21769). Measured on a 2-core EPYC (``pytorch-lightning`` 2.6.6): 0.52 ms per logged
   value, 0.17 ms with the shortcut. A sweep point logs 11 values every 10-20 steps of ~7 ms,
   so the walk was 4-8 % of its training time.
2. ``skip_inherited_callback_hooks``: Lightning calls each of a step's six callback hooks on
   every callback, the ones that inherit ``Callback``'s empty method too, and wraps each call in
   its profiler's context with an f-string of the callback's ``state_key`` (which
   ``ModelCheckpoint`` builds from its settings), even when the profiler does nothing. With the
   platform's eight callbacks that was 48 calls a step, of which 4 do anything. Together with
   the ``__setattr__`` shortcut in ``training/modules.py``, switched off and on every 40 steps
   in one run at a sweep point's shape, 1 thread (``python -m benchmarks.step_parts
   --ab-fixes``): 0.2-0.3 ms of a 3.9-5.7 ms step (3-7 %).
3. ``skip_unchanged_step_metrics``: after every training batch the logger connector gathers
   the step metrics again (detaching each, and ``.item()`` on each progress-bar value), even
   when nothing was logged since the last gather: the platform logs every
   ``log_every_n_steps``. On a GPU each ``.item()`` waits for the step's kernels, so the host
   could not run ahead of the device on any step. On a CPU the gather was ~1.5 % of a sweep
   point's step (``step_parts --ab-fixes --only metrics``: off/on 0.973-1.019, median 1.015,
   over six runs).
4. ``skip_empty_module_hooks``: Lightning calls about a dozen LightningModule and Strategy
   hooks a step, each inside the profiler's context with an f-string name, and half of them are
   ``ModelHooks``' empty defaults (``on_train_batch_start``, ``on_before_backward``, ...).
   ``step_parts --ab-fixes --only module_hooks``: off/on 1.013-1.024 in six runs on an idle
   host (~50 us of a 3.6 ms step).
5. ``skip_noop_batch_transfer``: to move each batch to the device, Lightning asks which of the
   module and the datamodule overrides ``transfer_batch_to_device`` and ``on_after_batch_transfer``
   (four ``is_overridden`` lookups), calls Lightning's defaults through its hook calls, and
   rebuilds the batch dict around the same tensors when they are on the device already, as every
   CPU batch is. ``step_parts --ab-fixes --only batch_transfer``: off/on 0.997-1.017 at a sweep
   point (4 runs), 1.06-1.17 on a tiny step (d 4, 1 layer, 1 x 8 tokens), where Lightning's
   share is largest.
6. ``remember_hook_signatures``: before every batch Lightning reads ``training_step``'s
   signature again (``inspect.getfullargspec``) to decide whether to pass ``batch_idx``
   (``--only batch_idx``: 1.004-1.024 at a sweep point, 1.07 on the tiny step), and every
   ``self.log`` in training reads it again (does it take ``dataloader_iter``?), a third of the
   ~250 Python calls a ``self.log`` makes; a sweep point logs 11 values every 19 steps.
7. ``find_training_results_directly``: ``trainer._results`` (read by every ``self.log``) walks
   two properties that compare the trainer's stage as a string.
"""

from __future__ import annotations

import dis
import functools
import logging
import operator
import weakref
from itertools import repeat
from typing import Any

import torch
from pytorch_lightning import Callback, LightningDataModule, LightningModule
from pytorch_lightning.profilers import PassThroughProfiler
from pytorch_lightning.trainer import call
from pytorch_lightning.trainer.connectors.logger_connector.logger_connector import _LoggerConnector
from pytorch_lightning.trainer.connectors.logger_connector.result import (
    _ResultCollection,
    _ResultMetric,
)

_MARK = "_scalelab_fix_applied"
log = logging.getLogger(call.__name__)  # the logger Lightning's own hook calls write to


def _tensors_on(metric: _ResultMetric, device: torch.device) -> bool:
    """Whether the holder's tensor states (value, cumulated batch size) and their reset
    defaults are all on ``device``: the original ``to`` moves them together."""
    found = metric.__dict__
    states = [found.get("value"), found.get("cumulated_batch_size"),
              *dict(found.get("_defaults") or {}).values()]
    tensors = [s for s in states if isinstance(s, torch.Tensor)]
    return bool(tensors) and all(t.device == device for t in tensors)


def skip_noop_result_moves() -> None:
    """Make ``_ResultMetric.to(device)`` return at once when its tensors are on ``device``.

    Only a bare ``.to(device)`` takes the shortcut; a dtype cast, a move elsewhere, or a
    holder whose value is a torchmetrics ``Metric`` (not a tensor) goes the original way.
    Idempotent: applying it twice wraps once.
    """
    original = _ResultMetric.to
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def to(self: _ResultMetric, *args: Any, **kwargs: Any) -> _ResultMetric:
        bare_device = not kwargs and len(args) == 1 and isinstance(args[0], (str, torch.device))
        if bare_device and _tensors_on(self, torch.device(args[0])):
            return self
        return original(self, *args, **kwargs)

    setattr(to, _MARK, True)
    _ResultMetric.to = to  # type: ignore[method-assign]


@functools.cache
def _class_defines(callback_type: type, hook_name: str) -> bool:
    """Whether the class has its own ``hook_name``: ``Callback``'s own hooks are all empty."""
    return getattr(callback_type, hook_name, None) is not getattr(Callback, hook_name, None)


def skip_inherited_callback_hooks() -> None:
    """Make Lightning's callback-hook dispatch skip callbacks whose hook is ``Callback``'s empty
    method, and skip the profiler's context when the profiler is the pass-through one.

    A real profiler (its records stay complete) and the ``monitoring_callbacks`` filter
    (checkpoint and early-stopping ordering) take the original path. A hook set on an instance
    rather than its class is called too. The order of the callbacks that run, and what the
    LightningModule's ``_current_fx_name`` reads inside them, are the original's. Idempotent.
    """
    original = call._call_callback_hooks
    if getattr(original, _MARK, False):
        return
    @functools.wraps(original)
    def dispatch(trainer: Any, hook_name: str, *args: Any, monitoring_callbacks: bool | None = None,
                 **kwargs: Any) -> None:
        if monitoring_callbacks is not None or not isinstance(trainer.profiler, PassThroughProfiler):
            return original(trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks, **kwargs)
        pl_module = trainer.lightning_module
        if pl_module:
            prev_fx_name = pl_module._current_fx_name
            pl_module._current_fx_name = hook_name
        for callback in trainer.callbacks:
            if hook_name in callback.__dict__ or _class_defines(type(callback), hook_name):
                fn = getattr(callback, hook_name)
                if callable(fn):
                    fn(trainer, pl_module, *args, **kwargs)
        if pl_module:
            pl_module._current_fx_name = prev_fx_name
        return None

    setattr(dispatch, _MARK, True)
    call._call_callback_hooks = dispatch


_LAST_GATHERS = "_scalelab_last_gathers"
_MISSING = object()


def _gather_inputs(results: _ResultCollection) -> list[Any]:
    """Everything an on-step gather reads from a result collection: the collection, its
    dataloader index, and each holder with whether it was reset and the tensor it last logged
    (its forward cache). Objects, not ids, so a freed id cannot be mistaken for a kept one."""
    inputs: list[Any] = [results, results.dataloader_idx]
    for m in results.values():
        inputs += (m, m.has_reset, m._forward_cache)
    return inputs


def _checked_dicts(connector: _LoggerConnector) -> tuple[dict[str, Any], ...]:
    """The dicts whose values the check below compares. The logged-metrics dict is not among
    them: at a logging step ``log_metrics`` rewrites it with equal, new tensors."""
    return connector._progress_bar_metrics, connector._callback_metrics


def _gather_would_repeat(connector: _LoggerConnector, results: _ResultCollection, now: list[Any]) -> bool:
    """Whether gathering from ``results``, whose inputs are ``now``, would write what its last
    gather wrote: the same inputs, the same three dicts (``reset_metrics`` replaces them), and
    every progress-bar and callback value it wrote still in place (another loop's gather of the
    same name, or the epoch-end gather, would have replaced it)."""
    last = connector.__dict__.get(_LAST_GATHERS, {}).get(id(results))
    if last is None:
        return False
    inputs, logged, written = last
    # map(operator.is_, ...) compares in C: this runs after every batch
    if len(now) != len(inputs) or not all(map(operator.is_, now, inputs)) or connector._logged_metrics is not logged:
        return False
    for d, (kept, keys, values) in zip(_checked_dicts(connector), written, strict=True):
        if d is not kept or not all(map(operator.is_, map(d.get, keys, repeat(_MISSING)), values)):
            return False
    return True


def fit_logs_this_step(trainer: Any) -> bool:
    """``_LoggerConnector.should_update_logs`` in a training batch, where the fit loop is the
    active loop, without finding the active loop through the trainer's state."""
    every = trainer.log_every_n_steps
    if every == 0:
        return False
    return (trainer.fit_loop.epoch_loop._batches_that_stepped + 1) % every == 0 or trainer.should_stop


def skip_unchanged_step_metrics() -> None:
    """Make ``_LoggerConnector.on_batch_end`` skip the metric gather when it would write what
    the previous gather from the same collection wrote; the batch references are dropped as
    before. The train and validation loops keep one record each. Idempotent."""
    original = _LoggerConnector.on_batch_end
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def on_batch_end(self: _LoggerConnector) -> None:
        results = self.trainer._results
        if results is None or self._first_loop_iter is None:  # not a batch: the original asserts
            return original(self)
        inputs = _gather_inputs(results)
        if _gather_would_repeat(self, results, inputs):
            results.batch = None
            results.batch_size = None
            return None
        original(self)
        written = tuple((d, tuple(d), tuple(d.values())) for d in _checked_dicts(self))
        self.__dict__.setdefault(_LAST_GATHERS, {})[id(results)] = (inputs, self._logged_metrics, written)
        return None

    setattr(on_batch_end, _MARK, True)
    _LoggerConnector.on_batch_end = on_batch_end  # type: ignore[method-assign]


def _does_nothing(fn: Any) -> bool:
    """Whether ``fn`` (a function or bound method) has a body of only a docstring and ``pass``:
    it returns None at once. Any other callable counts as doing something."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and _code_does_nothing(code)


@functools.cache  # keyed by code objects, which always hash (a hook may be any callable)
def _code_does_nothing(code: Any) -> bool:
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP")]
    return ops in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])


def skip_empty_module_hooks() -> None:
    """Make Lightning's LightningModule- and Strategy-hook calls skip the pass-through
    profiler's context, and skip a LightningModule hook whose function does nothing (its
    result, None, is the same). A real profiler takes Lightning's path. ``_current_fx_name``
    reads as before inside every hook that runs. Idempotent."""
    module_hook, strategy_hook = call._call_lightning_module_hook, call._call_strategy_hook
    if getattr(module_hook, _MARK, False):
        return

    @functools.wraps(module_hook)
    def call_module_hook(trainer: Any, hook_name: str, *args: Any, pl_module: Any = None, **kwargs: Any) -> Any:
        if not isinstance(trainer.profiler, PassThroughProfiler):
            return module_hook(trainer, hook_name, *args, pl_module=pl_module, **kwargs)
        log.debug("%s: calling lightning module hook: %s", type(trainer).__name__, hook_name)
        pl_module = pl_module or trainer.lightning_module
        if pl_module is None:
            raise TypeError("No `LightningModule` is available to call hooks on.")
        fn = getattr(pl_module, hook_name)
        if not callable(fn) or _does_nothing(fn):
            return None
        prev_fx_name = pl_module._current_fx_name
        pl_module._current_fx_name = hook_name
        output = fn(*args, **kwargs)
        pl_module._current_fx_name = prev_fx_name
        return output

    @functools.wraps(strategy_hook)
    def call_strategy_hook(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(trainer.profiler, PassThroughProfiler):
            return strategy_hook(trainer, hook_name, *args, **kwargs)
        log.debug("%s: calling strategy hook: %s", type(trainer).__name__, hook_name)
        pl_module = trainer.lightning_module
        prev_fx_name = pl_module._current_fx_name
        pl_module._current_fx_name = hook_name
        fn = getattr(trainer.strategy, hook_name)
        if not callable(fn):
            return None  # as Lightning's: the name stays set
        output = fn(*args, **kwargs)
        pl_module._current_fx_name = prev_fx_name
        return output

    for fn in (call_module_hook, call_strategy_hook):
        setattr(fn, _MARK, True)
    call._call_lightning_module_hook = call_module_hook
    call._call_strategy_hook = call_strategy_hook


_TRANSFER_HOOKS = ("transfer_batch_to_device", "on_after_batch_transfer")


def _lightnings_own(obj: Any, base: type) -> bool:
    """Whether ``obj`` (a module or datamodule) has Lightning's own transfer hooks."""
    return all(getattr(type(obj), name) is getattr(base, name) and name not in obj.__dict__
               for name in _TRANSFER_HOOKS)


def transfer_hooks_are_lightnings(module: LightningModule, datamodule: LightningDataModule | None) -> bool:
    """Whether neither the module nor the datamodule overrides a batch transfer hook."""
    return _lightnings_own(module, LightningModule) and (
        datamodule is None or _lightnings_own(datamodule, LightningDataModule))


def on_device(batch: Any, device: torch.device) -> bool:
    """Whether ``batch`` is a dict of tensors on ``device``, which Lightning's transfer would
    rebuild around the same tensors."""
    if type(batch) is not dict:
        return False
    for value in batch.values():
        if not isinstance(value, torch.Tensor) or value.device != device:
            return False
    return True


def skip_noop_batch_transfer() -> None:
    """Make a LightningModule hand a batch on as it is where the transfer would give the same
    tensors: a dict of tensors on the target device already, no transfer hook overridden in the
    module or the datamodule, and the pass-through profiler. Anything else takes Lightning's
    path. Idempotent."""
    original = LightningModule._apply_batch_transfer_handler
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def apply(self: LightningModule, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        trainer = self._trainer
        if type(batch) is dict and trainer is not None and isinstance(trainer.profiler, PassThroughProfiler):
            datamodule = trainer._data_connector._datahook_selector.datamodule
            if on_device(batch, device or self.device) and transfer_hooks_are_lightnings(self, datamodule):
                return batch
        return original(self, batch, device, dataloader_idx)

    setattr(apply, _MARK, True)
    LightningModule._apply_batch_transfer_handler = apply  # type: ignore[method-assign]


def remember_hook_signatures() -> None:
    """Make the training and evaluation loops (does the step take ``batch_idx``?) and ``self.log``
    (does ``training_step`` take ``dataloader_iter``?) read a hook's signature once per function:
    Lightning's own test, its answers kept for as long as the function lives. A callable that
    cannot be kept that way is read each time. Idempotent."""
    from pytorch_lightning.core import module as lightning_module
    from pytorch_lightning.loops import evaluation_loop, training_epoch_loop

    original = lightning_module.is_param_in_hook_signature
    if getattr(original, _MARK, False):
        return
    answers: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], bool]] = weakref.WeakKeyDictionary()

    @functools.wraps(original)
    def remembered(hook_fx: Any, param: str, explicit: bool = False, min_args: int | None = None) -> bool:
        key = getattr(hook_fx, "__func__", hook_fx)  # a bound method's signature is its function's
        try:
            known = answers.get(key)
            if known is None:
                known = answers[key] = {}
        except TypeError:  # not hashable or no weak reference
            return original(hook_fx, param, explicit, min_args)
        asked = (param, explicit, min_args)
        if asked not in known:
            known[asked] = original(hook_fx, param, explicit, min_args)
        return known[asked]

    setattr(remembered, _MARK, True)
    for user in (lightning_module, evaluation_loop, training_epoch_loop):
        user.is_param_in_hook_signature = remembered


def find_training_results_directly() -> None:
    """Make ``trainer._results`` return the training loop's result collection at once while the
    trainer trains. Lightning finds it through ``_active_loop`` and ``_FitLoop._results``, each
    testing ``trainer.training``, a string-enum compare: ~20 calls for each ``self.log`` and each
    step-metric write. The stage is compared by identity here, which holds exactly when
    ``trainer.training`` does for the enum member Lightning stores; any other stage takes
    Lightning's path. Idempotent."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.trainer.states import RunningStage

    original = Trainer._results
    if getattr(original.fget, _MARK, False):
        return

    @functools.wraps(original.fget)
    def results(self: Trainer) -> _ResultCollection | None:
        if self.state.stage is RunningStage.TRAINING:
            return self.fit_loop.epoch_loop._results
        return original.fget(self)

    setattr(results, _MARK, True)
    Trainer._results = property(results)  # type: ignore[method-assign,assignment]
