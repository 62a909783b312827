"""torch.profiler breakdown of training steps of a scalelab-train run (default experiment).

Runs ``scalelab-train`` in this process with a callback that profiles optimizer steps
``--start`` .. ``--start + --steps - 1`` from one batch start to the next, so Lightning's loop,
callbacks and logging between steps are inside the window. Prints the top ops by self CPU
time, per step.

    python -m benchmarks.profile_step [--steps 10] [--start 30] [hydra overrides ...]

Before/after a change: run it with PYTHONPATH pointing at each checkout's src/.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import scalelab.cli  # noqa: F401  (sets the OpenMP policy before torch loads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--start", type=int, default=30)
    ap.add_argument("--rows", type=int, default=18)
    args, overrides = ap.parse_known_args(argv if argv is not None else sys.argv[1:])

    import pytorch_lightning as pl
    import torch
    from torch.profiler import ProfilerActivity, profile

    import scalelab.cli.train as T

    class StepProfiler(pl.Callback):
        def __init__(self) -> None:
            self.prof: Any = None
            self.t0 = 0.0
            self.wall = 0.0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            step = int(trainer.global_step)
            if step == args.start and self.prof is None:
                self.prof = profile(activities=[ProfilerActivity.CPU])
                self.prof.__enter__()
                self.t0 = time.perf_counter()
            elif step == args.start + args.steps and self.prof is not None and not self.wall:
                self.wall = time.perf_counter() - self.t0
                self.prof.__exit__(None, None, None)

    profiler = StepProfiler()
    # Added through Lightning's Trainer rather than scalelab's callback list, so that the same
    # script profiles any checkout (PYTHONPATH=<old>/src): a "before" has other internals.
    init = pl.Trainer.__init__

    def init_with_profiler(self: Any, *a: Any, callbacks: Any = None, **k: Any) -> None:
        init(self, *a, callbacks=[*(callbacks or []), profiler], **k)

    pl.Trainer.__init__ = init_with_profiler  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = [sys.argv[0], f"paths.output_dir={tmp}/run", "logger=none",
                    f"train.max_steps={args.start + args.steps + 2}",
                    "trainer.enable_progress_bar=true", *overrides]
        try:
            T.main()
        except SystemExit as e:
            if e.code:
                raise
    if not profiler.wall:
        print("profile_step: the profiled steps never ran", file=sys.stderr)
        return 1
    print(f"\n{args.steps} steps from step {args.start}: {1000 * profiler.wall / args.steps:.1f} ms/step "
          f"wall; torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'default')}, load {os.getloadavg()[0]:.1f}, "
          f"code {Path(T.__file__).parents[3]}")
    table = profiler.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
