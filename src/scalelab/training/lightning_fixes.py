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
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from pytorch_lightning import Callback
from pytorch_lightning.profilers import PassThroughProfiler
from pytorch_lightning.trainer import call
from pytorch_lightning.trainer.connectors.logger_connector.result import _ResultMetric

_MARK = "_scalelab_fix_applied"


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
