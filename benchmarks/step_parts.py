"""Where a platform step goes, timed inside one ``scalelab-train`` run (this process).

Wraps the pieces of a training step with ``perf_counter`` for the steps ``--start`` ..
``--start + --steps`` and prints milliseconds a step: forward + loss, backward, clipping, the
optimizer step with Lightning's closure around it (which holds the three before), zero_grad and
the fetch of a batch, against the whole step (``total``, hook to hook: what is left is Lightning's
loop, hooks, logging and the lr scheduler). ``--preset`` is one of the training
bench's (default ``sweep_point``, where fixed per-step work is the largest share), its GPU
presets included; Hydra overrides go on top.

``--ab-fixes`` instead turns scalelab's per-step shortcuts (training/lightning_fixes.py,
training/lean_optimization.py, training/lean_batch.py, ``LMModule.__setattr__``, model/small_head_attention.py
and ``FlatAdamW``'s unwrapped step, ``optimizer_range``) off
and on in blocks of ``--block`` steps (A B B A ...), in the same run, and prints the median step
of each: the host's drift hits both alike, which separate runs on a shared machine cannot
promise. ``--only NAME[,NAME...]`` switches those named alone (the names are in ``FIXES``); unless
``lean_batch`` is among them, both sides run Lightning's own batch, which the lean batch would
bypass.

    python -m benchmarks.step_parts [--steps 2000] [--start 300] [hydra overrides ...]
    python -m benchmarks.step_parts --ab-fixes --steps 3000 train.num_threads=1
    python -m benchmarks.step_parts --ab-fixes --only metrics --steps 3000 train.num_threads=1
    python -m benchmarks.step_parts --ab-fixes --only small_heads --steps 3000 train.num_threads=1
    python -m benchmarks.step_parts --ab-fixes --only lean_optimization,batch_transfer,batch_idx
    python -m benchmarks.step_parts --preset encoder --start 50 --steps 300
    python -m benchmarks.step_parts --syncs --steps 200 --start 100

``--syncs`` instead counts, step by step, the tensor calls that make the host wait for the
device on a GPU (``.item()``, ``float()``, ``bool()``, ``.tolist()``, ``.cpu()``, ``.numpy()``)
and where they come from. A step that logs has some; the others should have none, or the host
cannot run ahead of the GPU. It exits 1 when they do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from typing import Any

import scalelab.cli  # noqa: F401  (sets the OpenMP policy before torch loads)

_OPEN: Counter = Counter()  # timed calls under way, by key: a nested one is not counted again


def _timed(owner: Any, name: str, key: str, acc: Counter, on: list[bool]) -> None:
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if not on[0] or _OPEN[key]:
            return original(*args, **kwargs)
        _OPEN[key] += 1
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - t0
            _OPEN[key] -= 1

    setattr(owner, name, timed)


def _wrap_pieces(acc: Counter, on: list[bool]) -> None:
    import torch
    from pytorch_lightning.loops import fetchers

    from scalelab.training.modules import LMModule

    for owner, name, key in [(LMModule, "_train_loss", "forward+loss"),
                             (torch.Tensor, "backward", "backward"),
                             (LMModule, "configure_gradient_clipping", "clipping"),
                             (torch.optim.Optimizer, "zero_grad", "zero_grad"),
                             (fetchers._DataFetcher, "__next__", "fetch")]:
        _timed(owner, name, key, acc, on)
    from scalelab.training.flat_params import FlatAdamW

    # FlatAdamW runs the closure itself, then AdamW's step (not counted twice: see _timed)
    for opt in (FlatAdamW, torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
        _timed(opt, "step", "optimizer+closure", acc, on)


SYNCS = ("item", "__float__", "__int__", "__bool__", "tolist", "cpu", "numpy")


def _count_syncs(by_step: Counter, where: Counter, on: list[bool], step: list[int]) -> None:
    """Count calls of SYNCS on tensors while the clock runs, by step and by calling line; not
    in the fetch of a batch, which is made on the host before it moves to the device."""
    import torch
    from pytorch_lightning.loops import fetchers

    fetching = [False]
    fetch = fetchers._DataFetcher.__next__

    def fetch_uncounted(self: Any) -> Any:
        fetching[0] = True
        try:
            return fetch(self)
        finally:
            fetching[0] = False

    fetchers._DataFetcher.__next__ = fetch_uncounted  # type: ignore[method-assign]
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            if on[0] and not fetching[0]:
                by_step[step[0]] += 1
                caller = traceback.extract_stack(limit=2)[0]
                where[f"{_name} {caller.filename.split('site-packages/')[-1]}:{caller.lineno}"] += 1
            return _original(self, *args, **kwargs)

        setattr(torch.Tensor, name, counted)


def _report_syncs(args: argparse.Namespace, by_step: Counter, where: Counter, log_every: int) -> int:
    logging = {s for s in range(args.start, args.start + args.steps) if (s + 1) % log_every == 0}
    on_log = sum(n for s, n in by_step.items() if s in logging)
    others = sum(n for s, n in by_step.items() if s not in logging)
    print(f"host syncs in {args.steps} steps (every {log_every}th logs): {on_log} on the "
          f"{len(logging)} logging steps, {others} on the other {args.steps - len(logging)}")
    for line, n in where.most_common(12):
        print(f"  {n:6d}  {line}")
    return 1 if others else 0


FIXES = ("callbacks", "setattr", "metrics", "module_hooks", "small_heads", "lean_optimization",
         "batch_transfer", "batch_idx", "lean_batch", "optimizer_range")


def _fix_names(value: str) -> str:
    unknown = set(value.split(",")) - set(FIXES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(FIXES)}")
    return value


def _fix_switch(which: str) -> Any:
    """set(on): scalelab's per-step shortcuts (``which``: FIXES names, comma-separated, or all) on or off
    (Lightning's originals)."""
    from pytorch_lightning import LightningModule
    from pytorch_lightning.loops import training_epoch_loop
    from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
    from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
    from pytorch_lightning.trainer import call
    from pytorch_lightning.trainer.connectors.logger_connector.logger_connector import (
        _LoggerConnector,
    )
    from torch import nn

    from scalelab.model import small_head_attention
    from scalelab.training import flat_params
    from scalelab.training.lean_batch import lean_training_batch
    from scalelab.training.lean_optimization import lean_automatic_optimization
    from scalelab.training.lightning_fixes import (
        remember_hook_signatures,
        skip_empty_module_hooks,
        skip_inherited_callback_hooks,
        skip_noop_batch_transfer,
        skip_unchanged_step_metrics,
    )
    from scalelab.training.modules import LMModule

    skip_inherited_callback_hooks()
    skip_unchanged_step_metrics()
    skip_empty_module_hooks()
    lean_automatic_optimization()
    skip_noop_batch_transfer()
    remember_hook_signatures()
    lean_training_batch()
    fast_advance, fast_advance_end = _TrainingEpochLoop.advance, _TrainingEpochLoop.on_advance_end
    fast_run, fast_transfer = _AutomaticOptimization.run, LightningModule._apply_batch_transfer_handler
    fast_signature = training_epoch_loop.is_param_in_hook_signature
    fast, fast_setattr, fast_end = call._call_callback_hooks, LMModule.__setattr__, _LoggerConnector.on_batch_end
    fast_module, fast_strategy = call._call_lightning_module_hook, call._call_strategy_hook
    watched = flat_params.watched
    switched = set(FIXES) if which == "all" else set(which.split(","))

    def set_fixes(on: bool) -> None:
        if "callbacks" in switched:
            call._call_callback_hooks = fast if on else fast.__wrapped__
        if "setattr" in switched:
            LMModule.__setattr__ = fast_setattr if on else nn.Module.__setattr__  # type: ignore[method-assign]
        if "metrics" in switched:
            _LoggerConnector.on_batch_end = fast_end if on else fast_end.__wrapped__  # type: ignore[method-assign]
        if "module_hooks" in switched:
            call._call_lightning_module_hook = fast_module if on else fast_module.__wrapped__
            call._call_strategy_hook = fast_strategy if on else fast_strategy.__wrapped__
        if "small_heads" in switched:
            small_head_attention.MODE = "measure" if on else "off"  # SDPA when off
        if "lean_optimization" in switched:
            _AutomaticOptimization.run = fast_run if on else fast_run.__wrapped__  # type: ignore[method-assign]
        if "batch_transfer" in switched:
            LightningModule._apply_batch_transfer_handler = (  # type: ignore[method-assign]
                fast_transfer if on else fast_transfer.__wrapped__)
        if "optimizer_range" in switched:  # off: FlatAdamW's step in torch's profiling wrapper
            flat_params.watched = watched if on else (lambda optimizer: True)
        if "batch_idx" in switched:  # the training loop's signature test
            training_epoch_loop.is_param_in_hook_signature = fast_signature if on else fast_signature.__wrapped__
        # the lean batch calls the hooks and the step itself, past the others: the others
        # switched without it run on Lightning's own batch
        lean = on and "lean_batch" in switched
        _TrainingEpochLoop.advance = fast_advance if lean else fast_advance.__wrapped__  # type: ignore[method-assign]
        _TrainingEpochLoop.on_advance_end = (  # type: ignore[method-assign]
            fast_advance_end if lean else fast_advance_end.__wrapped__)

    return set_fixes


def _train_with_clock(args: argparse.Namespace, overrides: list[str], acc: Counter, on: list[bool],
                      blocks: dict[bool, list[float]], set_fixes: Any, step: list[int]) -> int:
    """Run scalelab-train here with a callback that starts and stops the clock and keeps
    ``step`` current (and, with ``set_fixes``, switches the shortcuts at each block's first
    step). Returns the run's ``trainer.log_every_n_steps``."""
    import pytorch_lightning as pl

    from benchmarks.bench_train import GPU_PRESETS, PRESETS

    end = args.start + args.steps
    mark: dict[str, Any] = {}

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            step[0] = int(trainer.global_step)
            mark["log_every"] = int(trainer.log_every_n_steps)
            now = time.perf_counter()
            self.clock(step[0], now)

        def clock(self, step: int, now: float) -> None:
            if step == args.start:
                on[0], mark["t0"] = True, now
            elif step == end and on[0]:
                on[0], acc["total"] = False, now - mark["t0"]
            if set_fixes is None or not args.start <= step <= end or (step - args.start) % args.block:
                return
            if "fixes" in mark:
                blocks[mark["fixes"]].append((now - mark["t"]) / args.block)
            k = (step - args.start) // args.block
            mark["fixes"], mark["t"] = k % 4 in (0, 3), time.perf_counter()  # A B B A
            set_fixes(mark["fixes"])

    train_preset_here({**PRESETS, **GPU_PRESETS}[args.preset], Clock(), end + 2, overrides)
    return int(mark.get("log_every", 1))


def train_preset_here(preset: list[str], callback: Any, steps: int, overrides: list[str]) -> None:
    """Run ``scalelab-train`` in this process on a bench preset for ``steps`` steps, validating
    only at the end, no tracking, with ``callback`` added to the Trainer's; ``overrides`` last."""
    import pytorch_lightning as pl

    import scalelab.cli.train as T

    init = pl.Trainer.__init__

    def init_with(self: Any, *a: Any, callbacks: Any = None, **k: Any) -> None:
        init(self, *a, callbacks=[*(callbacks or []), callback], **k)

    pl.Trainer.__init__ = init_with  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        # after the preset, which may set its own length (sweep_point does)
        sys.argv = [sys.argv[0], *preset, f"paths.output_dir={tmp}/run", "logger=none",
                    f"train.max_steps={steps}", f"train.val_every={steps}", *overrides]
        try:
            T.main()
        except SystemExit as e:
            if e.code:
                raise
        finally:
            pl.Trainer.__init__ = init  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--start", type=int, default=300)
    ap.add_argument("--preset", default="sweep_point")
    ap.add_argument("--ab-fixes", action="store_true")
    ap.add_argument("--only", type=_fix_names, help="with --ab-fixes: switch these shortcuts alone "
                    f"(comma-separated, of {', '.join(FIXES)})")
    ap.add_argument("--syncs", action="store_true", help="count host syncs per step instead")
    ap.add_argument("--block", type=int, default=40)
    args, overrides = ap.parse_known_args(argv if argv is not None else sys.argv[1:])

    acc: Counter = Counter()
    on = [False]
    blocks: dict[bool, list[float]] = {True: [], False: []}
    set_fixes = _fix_switch(args.only or "all") if args.ab_fixes else None
    step, by_step, where = [0], Counter(), Counter()
    if args.syncs:
        _count_syncs(by_step, where, on, step)
    elif not args.ab_fixes:
        _wrap_pieces(acc, on)
    log_every = _train_with_clock(args, overrides, acc, on, blocks, set_fixes, step)
    if "total" not in acc:
        print("step_parts: the timed steps never ran (raise train.max_steps?)", file=sys.stderr)
        return 1
    if args.syncs:
        return _report_syncs(args, by_step, where, log_every)
    if set_fixes is not None:
        on_ms, off_ms = (1000 * statistics.median(blocks[k]) for k in (True, False))
        print(f"fixes on {on_ms:.3f} ms/step, off {off_ms:.3f} ms/step: off/on {off_ms / on_ms:.3f} "
              f"({len(blocks[True])} + {len(blocks[False])} blocks of {args.block} steps)")
        return 0
    print(f"{args.steps} steps from step {args.start}, ms a step:")
    for key, value in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {key:<18} {1000 * value / args.steps:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
