"""Lightning's automatic optimization of one batch, without the layers that pass it along.

For one batch, Lightning's automatic optimization builds a ``Closure`` of three partials,
calls the module's ``optimizer_step`` hook, which calls ``LightningOptimizer.step``, which calls
``Strategy.optimizer_step``, which calls ``Precision.optimizer_step``, which wraps the closure
once more and calls ``optimizer.step(closure)``. The closure calls ``training_step`` through the
strategy and backpropagates the loss through the strategy and the precision plugin. Where the strategy, the precision plugin and the module's ``optimizer_step`` are
Lightning's own (a one-device run in fp32 or bf16 without a grad scaler), each of those layers
only passes the call on; ``lean_automatic_optimization`` makes the same calls in the same order
without them: the same hooks with the same arguments and the same ``_current_fx_name``, the same
progress counters, the same loss and gradients. Anything else (DDP, a grad scaler, gradient
accumulation, a real profiler, an overridden ``optimizer_step``, a skipped backward) takes
Lightning's path. ``python -m benchmarks.step_parts --ab-fixes --only lean_optimization``: off/on
0.98-1.04 a sweep point's step over six runs (median 1.005), 1.03-1.04 on a tiny step (d 4,
1 layer, 1 x 8 tokens), where Lightning's share is largest.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

import torch
from pytorch_lightning import LightningModule
from pytorch_lightning.loops.optimization.automatic import (
    Closure,
    ClosureResult,
    _AutomaticOptimization,
)
from pytorch_lightning.plugins.precision import MixedPrecision, Precision
from pytorch_lightning.profilers import PassThroughProfiler
from pytorch_lightning.strategies import SingleDeviceStrategy
from pytorch_lightning.trainer import call
from pytorch_lightning.utilities.exceptions import MisconfigurationException

_MARK = "_scalelab_lean"


def _passes_through(loop: _AutomaticOptimization) -> bool:
    """Whether every layer between the loop and ``optimizer.step`` is Lightning's own and so
    only passes the call on (the module docstring lists them)."""
    trainer = loop.trainer
    module = trainer.lightning_module
    strategy = trainer.strategy
    precision = strategy.precision_plugin
    return (not loop._skip_backward and trainer.accumulate_grad_batches == 1
            and isinstance(trainer.profiler, PassThroughProfiler)
            and type(strategy) is SingleDeviceStrategy and strategy.model is module
            and (type(precision) is Precision or (type(precision) is MixedPrecision and precision.scaler is None))
            and type(module).optimizer_step is LightningModule.optimizer_step
            and "optimizer_step" not in module.__dict__)


def _step(loop: _AutomaticOptimization, optimizer: torch.optim.Optimizer, batch_idx: int,
          kwargs: OrderedDict) -> dict[str, Any]:
    trainer = loop.trainer
    module = trainer.lightning_module
    precision = trainer.strategy.precision_plugin
    progress = loop.optim_progress.optimizer
    out: list[ClosureResult] = []

    def closure() -> torch.Tensor | None:  # Closure.closure, then Precision._wrap_closure's rest
        with torch.enable_grad():
            module._current_fx_name = "training_step"  # as _call_strategy_hook sets it
            with precision.train_step_context():
                result = ClosureResult.from_training_step_output(module.training_step(*kwargs.values()))
            module._current_fx_name = "optimizer_step"
            out.append(result)
            if result.closure_loss is None:
                Closure.warning_cache.warn(
                    "`training_step` returned `None`. If this was on purpose, ignore this warning...")
            progress.zero_grad.increment_ready()
            call._call_callback_hooks(trainer, "on_before_zero_grad", optimizer)
            call._call_lightning_module_hook(trainer, "on_before_zero_grad", optimizer)
            progress.zero_grad.increment_started()
            call._call_lightning_module_hook(trainer, "optimizer_zero_grad", trainer.current_epoch, batch_idx,
                                             optimizer)
            progress.zero_grad.increment_completed()
            if result.closure_loss is not None:
                module._current_fx_name = "backward"
                loss = precision.pre_backward(result.closure_loss, module)
                module.backward(loss)
                precision.post_backward(loss, module)
                module._current_fx_name = "optimizer_step"
        precision._after_closure(module, optimizer)
        return result.loss

    progress.step.increment_ready()
    previous = module._current_fx_name
    module._current_fx_name = "optimizer_step"
    optimizer.step(closure=closure)
    module._current_fx_name = previous
    progress.step.increment_completed()
    if not out:  # Closure.consume_result's check
        raise MisconfigurationException(
            "The closure hasn't been executed. HINT: did you call `optimizer_closure()` in your"
            " `optimizer_step` hook? It could also happen because the `optimizer.step(optimizer_closure)`"
            " call did not execute it internally.")
    result = out[-1]  # an optimizer may run the closure more than once (LBFGS); Lightning keeps the last
    return {} if result.loss is None else result.asdict()


def lean_automatic_optimization() -> None:
    """Make ``_AutomaticOptimization.run`` take ``_step`` where ``_passes_through`` holds, and
    Lightning's own path otherwise. Idempotent."""
    original = _AutomaticOptimization.run
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def run(self: _AutomaticOptimization, optimizer: torch.optim.Optimizer, batch_idx: int,
            kwargs: OrderedDict) -> dict[str, Any]:
        if _passes_through(self):
            return _step(self, optimizer, batch_idx, kwargs)
        return original(self, optimizer, batch_idx, kwargs)

    setattr(run, _MARK, True)
    _AutomaticOptimization.run = run  # type: ignore[method-assign]
