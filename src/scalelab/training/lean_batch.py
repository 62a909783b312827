"""Lightning's training batch, its loop bookkeeping without the layers that pass it along.

``_TrainingEpochLoop.advance`` and ``on_advance_end`` run once a batch. Around the step itself
they check for a restart, a distributed stop signal, a ``dataloader_iter`` step, a skipped epoch
and plateau schedulers, dispatch the hook calls through the strategy, the trainer's properties and
the profiler, read the lr schedulers' settings three times and test for validation from scratch.
At a sweep point (a 2.8 ms step, 5,772 parameters) that was ~500 Python calls a batch beyond a
hand loop's 410, and Lightning's steps took 1.14x the hand loop's time.

Where every layer is Lightning's own and passes the call on (``hook_plan.layers_pass_through``, no
gradient accumulation), the fetcher is Lightning's prefetching one and the loop is not restarting,
``lean_training_batch`` makes the calls of a batch in Lightning's order through a ``HookPlan``: the
same hooks with the same arguments and ``_current_fx_name``, the same progress counters,
schedulers, logged rows and validation batches. A batch that validates, a plateau scheduler and
anything else take Lightning's path. With it (and the shortcuts of 1dcc8d8 and 03e3932), ``python
-m benchmarks.loop_overhead``: 1.14 -> 1.07 (docs/performance.md, twenty-fifth session).
"""

from __future__ import annotations

import functools
import operator
from collections import OrderedDict

from pytorch_lightning.loops.fetchers import _DataFetcher, _PrefetchDataFetcher
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.utilities.exceptions import SIGTERMException

from scalelab.training.hook_plan import HookPlan, plan_for
from scalelab.training.lean_optimization import _passes_through, _step
from scalelab.training.lightning_fixes import fit_logs_this_step

_MARK = "_scalelab_lean"
_LEAN_BATCH = "_scalelab_lean_batch"  # this batch's plan, from advance to on_advance_end
_ON_PLATEAU = operator.attrgetter("reduce_on_plateau")


def _lean(loop: _TrainingEpochLoop, data_fetcher: _DataFetcher) -> HookPlan | None:
    """The plan of this batch where it can take the lean path; None where Lightning's."""
    if loop._restarting or type(data_fetcher) is not _PrefetchDataFetcher:
        return None
    plan = plan_for(loop, loop.trainer)
    if plan is None or not _passes_through(loop.automatic_optimization) or not plan.module.automatic_optimization:
        return None
    return plan


def _step_schedulers(loop: _TrainingEpochLoop, plan: HookPlan, batch_number: int) -> None:
    """``update_lr_schedulers("step", update_plateau_schedulers=False)`` for one optimizer
    step (no accumulation)."""
    for config in loop.trainer.lr_scheduler_configs:
        if not config.reduce_on_plateau and config.interval == "step" and batch_number % config.frequency == 0:
            loop.scheduler_progress.increment_ready()
            plan.call_module("lr_scheduler_step", config.scheduler, None)
            loop.scheduler_progress.increment_completed()


def _advance(loop: _TrainingEpochLoop, data_fetcher: _DataFetcher, plan: HookPlan) -> None:
    """``_TrainingEpochLoop.advance`` for a batch that ``_lean`` admits."""
    trainer, progress = loop.trainer, loop.batch_progress
    if loop.val_loop._restarting:
        loop.val_loop.restarting = False
    batch, _, __ = next(data_fetcher)
    batch_idx = progress.current.ready  # Lightning's self.batch_idx + 1
    progress.is_last_batch = data_fetcher.done
    batch = plan.to_device(batch)  # the precision plugin's convert_input passes it on
    progress.increment_ready()
    connector = trainer._logger_connector
    connector.on_batch_start(batch)
    output, ends_epoch = None, False
    if batch is None:
        loop._warning_cache.warn("train_dataloader yielded None. If this was on purpose, ignore this warning...")
    elif plan.fire("on_train_batch_start", batch, batch_idx) == -1:  # the strategy's hook is empty
        ends_epoch = True
        progress.increment_by(0, is_last_batch=True)
    else:
        progress.increment_started()
        kwargs = loop._build_kwargs(OrderedDict(), batch, batch_idx)
        output = _step(loop.automatic_optimization, trainer.optimizers[0], batch_idx, kwargs, plan)
    progress.increment_processed()
    _step_schedulers(loop, plan, progress.current.ready)
    if loop._num_ready_batches_reached():
        loop.update_lr_schedulers("epoch", update_plateau_schedulers=False)
    if ends_epoch:
        raise StopIteration
    plan.fire("on_train_batch_end", output, batch, batch_idx)
    connector.on_batch_end()
    progress.increment_completed()
    if fit_logs_this_step(trainer) or trainer.fast_dev_run:  # update_train_step_metrics
        connector.log_metrics(connector.metrics["log"])


def _cannot_validate(loop: _TrainingEpochLoop) -> bool:
    """True only where ``loop._should_check_val_fx`` would be False: not the epoch's last batch,
    no stop request, no time interval, and not a validation batch by count (Lightning's test,
    in its order, from there on). It skips what that test reads first, ``trainer.enable_validation``
    (a dozen calls); what it cannot rule out is left to Lightning's test."""
    trainer = loop.trainer
    if loop.batch_progress.is_last_batch or trainer.should_stop \
            or getattr(trainer, "_val_check_time_interval", None) is not None:
        return False
    every, limit = trainer.val_check_batch, trainer.limit_train_batches
    if every == float("inf"):
        return not (isinstance(limit, int) and (loop.batch_idx + 1) % limit == 0)
    if every is None:
        return False
    iteration = loop.total_batch_idx if trainer.check_val_every_n_epoch is None else loop.batch_idx
    return (iteration + 1) % every != 0


def _end_without_validation(loop: _TrainingEpochLoop) -> None:
    """``_TrainingEpochLoop.on_advance_end`` for a batch that does not validate, with no plateau
    scheduler (whose update would come here) and one optimizer step a batch."""
    loop._batches_that_stepped += 1
    trainer = loop.trainer
    if trainer.should_stop:  # _save_loggers_on_train_batch_end
        for logger in trainer.loggers:
            logger.save()
    if trainer.received_sigterm and not loop._is_training_done:  # the flag first: it is read every batch
        raise SIGTERMException


def lean_training_batch() -> None:
    """Make ``_TrainingEpochLoop.advance`` and ``on_advance_end`` take the lean path where
    ``_lean`` admits the batch, and Lightning's otherwise. Idempotent."""
    advance, on_advance_end = _TrainingEpochLoop.advance, _TrainingEpochLoop.on_advance_end
    if getattr(advance, _MARK, False):
        return

    @functools.wraps(advance)
    def lean_advance(self: _TrainingEpochLoop, data_fetcher: _DataFetcher) -> None:
        plan = self.__dict__[_LEAN_BATCH] = _lean(self, data_fetcher)
        if plan is None:
            return advance(self, data_fetcher)
        return _advance(self, data_fetcher, plan)

    @functools.wraps(on_advance_end)
    def lean_on_advance_end(self: _TrainingEpochLoop, data_fetcher: _DataFetcher) -> None:
        lean = self.__dict__.pop(_LEAN_BATCH, None) is not None
        trainer = self.trainer
        if not lean or self._skip_next_val or trainer.accumulate_grad_batches != 1 or any(
                map(_ON_PLATEAU, trainer.lr_scheduler_configs)) or not (
                _cannot_validate(self) or not self._should_check_val_fx(data_fetcher)):
            return on_advance_end(self, data_fetcher)
        return _end_without_validation(self)

    for fn in (lean_advance, lean_on_advance_end):
        setattr(fn, _MARK, True)
    _TrainingEpochLoop.advance = lean_advance  # type: ignore[method-assign]
    _TrainingEpochLoop.on_advance_end = lean_on_advance_end  # type: ignore[method-assign]
