"""What Lightning's loop costs a step: the platform's steps against a hand loop over the same
module, optimizer, scheduler and train stream, in blocks that alternate inside one
``scalelab-train`` run (this process).

From step ``--start``, before every ``--block``-th Lightning step, a callback runs ``--block``
steps of a hand loop: the next batch from a DataLoader over the datamodule's own train stream,
``training_step``, ``zero_grad``, ``backward``, the module's own gradient clipping, the optimizer
step and the lr scheduler's, with no hooks, logging or progress records. Prints the median
microseconds a step of each and their ratio: what a hand-written loop around the same pieces
would gain, with the host's drift hitting both alike. The bench's (3)/(2) takes turns between
two processes and spreads ±0.05 a round, more than most single changes to the loop.

The hand loop does not log; the platform's side logs at the preset's cadence (sweep_point: every
19 steps), and ``trainer.log_every_n_steps=100000`` takes its logging steps out too.

    python -m benchmarks.loop_overhead [--blocks 40] [--block 50] [--start 200] [hydra overrides ...]
    python -m benchmarks.loop_overhead --preset pystdlib_small --blocks 10 --block 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import scalelab.cli  # noqa: F401  (sets the OpenMP policy before torch loads)


def _hand_steps(trainer: Any, module: Any, batches: Any, n: int) -> float:
    """Seconds a step of ``n`` hand-loop steps on the run's own module, optimizer and schedule."""
    optimizer = trainer.optimizers[0]
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    t0 = time.perf_counter()
    for i in range(n):
        loss = module.training_step(next(batches), i)
        optimizer.zero_grad()
        loss.backward()
        module.configure_gradient_clipping(optimizer)
        optimizer.step()
        scheduler.step()
    return (time.perf_counter() - t0) / n


def _alternating(args: argparse.Namespace, times: dict[str, list[float]]) -> Any:
    import pytorch_lightning as pl

    class Alternate(pl.Callback):
        def __init__(self) -> None:
            self.mark: float | None = None
            self.batches: Any = None

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, idx: int) -> None:
            step = int(trainer.global_step)
            if step < args.start or (step - args.start) % args.block:
                return
            if self.mark is not None:  # a Lightning block ends here: hand, Lightning, hand, ...
                times["lightning"].append((time.perf_counter() - self.mark) / args.block)
                self.mark = None
            if len(times["hand"]) < args.blocks:
                if self.batches is None:
                    self.batches = iter(trainer.datamodule.train_dataloader())
                times["hand"].append(_hand_steps(trainer, module, self.batches, args.block))
                self.mark = time.perf_counter()

    return Alternate()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="sweep_point")
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--block", type=int, default=50)
    ap.add_argument("--start", type=int, default=200)
    args, overrides = ap.parse_known_args(argv)
    from benchmarks.bench_train import PRESET_THREADS, PRESETS
    from benchmarks.step_parts import train_preset_here

    times: dict[str, list[float]] = {"hand": [], "lightning": []}
    threads = PRESET_THREADS.get(args.preset)
    train_preset_here(PRESETS[args.preset], _alternating(args, times),
                      args.start + (args.blocks + 1) * args.block + 2,
                      [*([f"train.num_threads={threads}"] if threads else []), *overrides])
    if not times["lightning"]:
        print("loop_overhead: no block ran (raise train.max_steps?)")
        return 1
    hand, lightning = statistics.median(times["hand"]), statistics.median(times["lightning"])
    print(f"hand loop {1e6 * hand:.0f} us a step, Lightning {1e6 * lightning:.0f} us a step: "
          f"hand/Lightning speed {lightning / hand:.3f} ({len(times['hand'])} + {len(times['lightning'])} "
          f"blocks of {args.block} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
