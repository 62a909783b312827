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

import contextlib
import functools
from collections import OrderedDict
from typing import Any

import torch
from pytorch_lightning.loops.optimization.automatic import (
    Closure,
    ClosureResult,
    _AutomaticOptimization,
)
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from scalelab.training.hook_plan import FX, HookPlan, plan_for

_MARK = "_scalelab_lean"


def _passes_through(loop: _AutomaticOptimization) -> bool:
    """Whether every layer between the loop and ``optimizer.step`` only passes the call on (the
    module docstring lists them), once ``plan_for`` gave a plan (the layers are Lightning's own)."""
    return not loop._skip_backward and loop.trainer.accumulate_grad_batches == 1


def _result_of(output: Any) -> ClosureResult:
    """``ClosureResult.from_training_step_output`` without accumulation, less its ``loss / 1``
    for a tensor: a kernel and a backward node every step that change no number."""
    if isinstance(output, torch.Tensor):
        return ClosureResult(output)
    return ClosureResult.from_training_step_output(output)


def _step(loop: _AutomaticOptimization, optimizer: torch.optim.Optimizer, batch_idx: int,
          kwargs: OrderedDict, plan: HookPlan) -> dict[str, Any]:
    trainer = loop.trainer
    module, names = plan.module, plan.names
    precision = trainer.strategy.precision_plugin
    # Precision's train_step_context enters a null context; MixedPrecision's, autocast
    context = precision.train_step_context if type(precision) is not Precision else contextlib.nullcontext
    progress = loop.optim_progress.optimizer
    out: list[ClosureResult] = []

    def closure() -> torch.Tensor | None:  # Closure.closure, then Precision._wrap_closure's rest
        with torch.enable_grad():
            names[FX] = "training_step"  # as _call_strategy_hook sets it
            with context():
                result = _result_of(module.training_step(*kwargs.values()))
            names[FX] = "optimizer_step"
            out.append(result)
            if result.closure_loss is None:
                Closure.warning_cache.warn(
                    "`training_step` returned `None`. If this was on purpose, ignore this warning...")
            progress.zero_grad.increment_ready()
            plan.fire("on_before_zero_grad", optimizer)
            progress.zero_grad.increment_started()
            plan.call_module("optimizer_zero_grad", trainer.current_epoch, batch_idx, optimizer)
            progress.zero_grad.increment_completed()
            if result.closure_loss is not None:
                plan.fire("on_before_backward", result.closure_loss)  # Precision.pre_backward, no scaler
                names[FX] = "backward"  # as _call_strategy_hook("backward") sets it
                module.backward(result.closure_loss)
                names[FX] = "optimizer_step"
                plan.fire("on_after_backward")  # Precision.post_backward
        plan.fire("on_before_optimizer_step", optimizer)  # Precision._after_closure
        plan.call_module("configure_gradient_clipping", optimizer, gradient_clip_val=trainer.gradient_clip_val,
                         gradient_clip_algorithm=trainer.gradient_clip_algorithm)
        return result.loss

    progress.step.increment_ready()
    previous, names[FX] = names[FX], "optimizer_step"
    optimizer.step(closure=closure)
    names[FX] = previous
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
        plan = plan_for(self, self.trainer)
        if plan is not None and _passes_through(self):
            return _step(self, optimizer, batch_idx, kwargs, plan)
        return original(self, optimizer, batch_idx, kwargs)

    setattr(run, _MARK, True)
    _AutomaticOptimization.run = run  # type: ignore[method-assign]
