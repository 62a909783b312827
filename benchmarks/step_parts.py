"""Where a platform step goes, timed inside one ``scalelab-train`` run (this process).

Wraps the pieces of a training step with ``perf_counter`` for the steps ``--start`` ..
``--start + --steps`` and prints milliseconds a step: forward + loss, backward, clipping, the
optimizer step with Lightning's closure around it (which holds the three before), zero_grad and
the fetch of a batch, against the whole step (``total``, hook to hook: what is left is Lightning's
loop, hooks, logging and the lr scheduler). ``--preset`` is one of the training
bench's (default ``sweep_point``, where fixed per-step work is the largest share), its GPU
presets included; Hydra overrides go on top.

    python -m benchmarks.step_parts [--steps 2000] [--start 300] [hydra overrides ...]
    python -m benchmarks.step_parts --preset encoder --start 50 --steps 300
    python -m benchmarks.step_parts --syncs --steps 200 --start 100

``--syncs`` instead counts, step by step, the tensor calls that make the host wait for the
device on a GPU (``.item()``, ``float()``, ``bool()``, ``.tolist()``, ``.cpu()``, ``.numpy()``)
and where they come from. A step that logs has some; the others should have none, or the host
cannot run ahead of the GPU. It exits 1 when they do.
"""

from __future__ import annotations

import argparse
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

    for owner, name, key in [(LMModule, "training_step", "forward+loss"),
                             (torch.Tensor, "backward", "backward"),
                             (LMModule, "configure_gradient_clipping", "clipping"),
                             (torch.optim.Optimizer, "zero_grad", "zero_grad"),
                             (fetchers._DataFetcher, "__next__", "fetch")]:
        _timed(owner, name, key, acc, on)
    for opt in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
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


def _train_with_clock(args: argparse.Namespace, overrides: list[str], acc: Counter, on: list[bool],
                      step: list[int]) -> int:
    """Run scalelab-train here with a callback that starts and stops the clock and keeps
    ``step`` current. Returns the run's ``trainer.log_every_n_steps``."""
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
    ap.add_argument("--syncs", action="store_true", help="count host syncs per step instead")
    args, overrides = ap.parse_known_args(argv if argv is not None else sys.argv[1:])

    acc: Counter = Counter()
    on = [False]
    step, by_step, where = [0], Counter(), Counter()
    if args.syncs:
        _count_syncs(by_step, where, on, step)
    else:
        _wrap_pieces(acc, on)
    log_every = _train_with_clock(args, overrides, acc, on, step)
    if "total" not in acc:
        print("step_parts: the timed steps never ran (raise train.max_steps?)", file=sys.stderr)
        return 1
    if args.syncs:
        return _report_syncs(args, by_step, where, log_every)
    print(f"{args.steps} steps from step {args.start}, ms a step:")
    for key, value in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {key:<18} {1000 * value / args.steps:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
