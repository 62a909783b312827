"""The hooks of one training batch, looked up once per run rather than at every call.

For each hook of a batch, Lightning's hook calls look up ``trainer.lightning_module`` (through the
strategy), every callback's method, the LightningModule's method and the profiler, at every call:
about a dozen dispatches a batch, each a handful of property reads. A ``HookPlan`` holds, for
one trainer, module and list of callbacks, the bound methods that do something, in Lightning's
order: the callbacks' (those that inherit ``Callback``'s empty method left out, and a
checkpoint's per-batch test where it cannot save), then the module's (left out where it is
``ModelHooks``' empty default). ``fire`` calls them with the
arguments and the ``_current_fx_name`` Lightning's calls give. ``plan_for`` builds a new plan
at each fit and when the trainer's callbacks, module, strategy or profiler change; a hook method
replaced on a callback or the module while a fit runs is called from the next fit on (Lightning
looks it up at each call).
"""

from __future__ import annotations

from typing import Any

from pytorch_lightning import LightningModule, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.precision import MixedPrecision, Precision
from pytorch_lightning.profilers import PassThroughProfiler
from pytorch_lightning.strategies import SingleDeviceStrategy
from torch import nn

from scalelab.training.lightning_fixes import (
    _class_defines,
    _does_nothing,
    on_device,
    transfer_hooks_are_lightnings,
)

# Called on the callbacks and then on the module, in this order within a batch.
BATCH_HOOKS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
               "on_before_optimizer_step", "on_train_batch_end")
# Called on the module alone.
MODULE_HOOKS = ("optimizer_zero_grad", "configure_gradient_clipping", "lr_scheduler_step")
_PLAN = "_scalelab_hook_plan"
# ``__setattr__`` methods that store ``_current_fx_name`` in the instance's ``__dict__`` and do
# nothing else with it, so the plan may write it there itself (LMModule's is registered too).
PLAIN_SETATTRS: set[Any] = {nn.Module.__setattr__}


def plain_setattr(fn: Any) -> Any:
    """Register a ``__setattr__`` that stores ``_current_fx_name`` as ``nn.Module``'s does."""
    PLAIN_SETATTRS.add(fn)
    return fn


FX = "_current_fx_name"


def layers_pass_through(trainer: Trainer, module: LightningModule) -> bool:
    """Whether the strategy, the precision plugin, the profiler and the module's
    ``optimizer_step`` are Lightning's own, which only pass an optimizer step on: one device,
    fp32 or mixed precision without a grad scaler, no profiling."""
    strategy = trainer.strategy
    precision = strategy.precision_plugin
    return (isinstance(trainer.profiler, PassThroughProfiler)
            and type(strategy) is SingleDeviceStrategy and strategy.model is module
            and (type(precision) is Precision or (type(precision) is MixedPrecision and precision.scaler is None))
            and type(module).optimizer_step is LightningModule.optimizer_step
            and "optimizer_step" not in module.__dict__)


def _idle_checkpoint_hook(callback: Any, name: str) -> bool:
    """Whether ``name`` is Lightning's ``ModelCheckpoint.on_train_batch_end`` on a checkpoint with
    no step or time interval (scalelab's default: it saves at validation), which under automatic
    optimization returns without a change: the step test ``every_n_train_steps < 1`` and the
    time test are both off. Its settings are read when the plan is built."""
    return (name == "on_train_batch_end" and isinstance(callback, ModelCheckpoint) and name not in callback.__dict__
            and type(callback).on_train_batch_end is ModelCheckpoint.on_train_batch_end
            and callback._every_n_train_steps < 1 and callback._train_time_interval is None)


class _AttributeNames:
    """``_current_fx_name`` read and written through the module's own ``__setattr__``."""

    __slots__ = ("module",)

    def __init__(self, module: Any) -> None:
        self.module = module

    def __getitem__(self, key: str) -> Any:
        return getattr(self.module, key)

    def __setitem__(self, key: str, value: Any) -> None:
        setattr(self.module, key, value)


class HookPlan:
    """``names[FX]`` reads and writes the module's ``_current_fx_name``; ``transfer_is_noop``:
    the transfer hooks are Lightning's own, so a batch already on ``device`` stays as it is.
    Built only where ``layers_pass_through`` holds."""

    __slots__ = ("_seen", "before_transfer", "callbacks", "device", "module", "module_hooks", "names",
                 "trainer", "transfer_is_noop")

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        module = self.module = trainer.lightning_module
        callbacks = list(trainer.callbacks)
        self.callbacks = {name: tuple(getattr(cb, name) for cb in callbacks
                                      if (name in cb.__dict__ or _class_defines(type(cb), name))
                                      and not _idle_checkpoint_hook(cb, name))
                          for name in BATCH_HOOKS}
        self.module_hooks: dict[str, Any] = {}
        for name in BATCH_HOOKS + MODULE_HOOKS:
            fn = getattr(module, name)
            self.module_hooks[name] = None if not callable(fn) or _does_nothing(fn) else fn
        plain = type(module).__setattr__ in PLAIN_SETATTRS and FX in module.__dict__
        self.names: Any = module.__dict__ if plain else _AttributeNames(module)
        selector = trainer._data_connector._datahook_selector
        # the object whose on_before_batch_transfer Lightning calls: the datamodule's or the module's
        source = selector.get_instance("on_before_batch_transfer")
        self.before_transfer = (source.on_before_batch_transfer, source is module)
        self.device = trainer.strategy.root_device
        self.transfer_is_noop = transfer_hooks_are_lightnings(module, selector.datamodule)
        # the selector is made anew at each fit: a plan lasts one fit at most
        self._seen = (callbacks, module, trainer.strategy, trainer.profiler, selector)

    def holds_for(self, trainer: Trainer) -> bool:
        callbacks, module, strategy, profiler, selector = self._seen
        return (trainer.callbacks == callbacks and trainer.strategy is strategy
                and strategy._lightning_module is module and trainer.profiler is profiler
                and trainer._data_connector._datahook_selector is selector)

    def fire(self, name: str, *args: Any) -> Any:
        """Lightning's callback-hook call, then its module-hook call, of ``name``. Returns the
        module hook's result."""
        names = self.names
        previous, names[FX] = names[FX], name
        for fn in self.callbacks[name]:
            fn(self.trainer, self.module, *args)
        hook = self.module_hooks[name]
        out = None if hook is None else hook(*args)
        names[FX] = previous
        return out

    def call_module(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Lightning's module-hook call of one of ``MODULE_HOOKS``."""
        hook = self.module_hooks[name]
        if hook is None:
            return None
        names = self.names
        previous, names[FX] = names[FX], name
        out = hook(*args, **kwargs)
        names[FX] = previous
        return out

    def to_device(self, batch: Any) -> Any:
        """``_on_before_batch_transfer`` and the strategy's ``batch_to_device`` of a batch."""
        fn, on_module = self.before_transfer
        names = self.names
        if on_module:  # Lightning's datamodule-hook call leaves the name as it is
            previous, names[FX] = names[FX], "on_before_batch_transfer"
            batch = fn(batch, 0)
            names[FX] = previous
        else:
            batch = fn(batch, 0)
        if self.transfer_is_noop and on_device(batch, self.device):
            return batch
        previous, names[FX] = names[FX], "batch_to_device"
        batch = self.trainer.strategy.batch_to_device(batch, dataloader_idx=0)
        names[FX] = previous
        return batch


def plan_for(owner: Any, trainer: Trainer) -> HookPlan | None:
    """The plan kept on ``owner`` (a loop) while it holds for ``trainer``, or a new one; None
    where the layers do not pass the step through (``layers_pass_through``): those runs take
    Lightning's path and keep no plan."""
    plan = owner.__dict__.get(_PLAN)
    if plan is not None and plan.holds_for(trainer):
        return plan
    owner.__dict__.pop(_PLAN, None)
    if not layers_pass_through(trainer, trainer.lightning_module):
        return None
    plan = owner.__dict__[_PLAN] = HookPlan(trainer)
    return plan
