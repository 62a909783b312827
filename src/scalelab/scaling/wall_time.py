"""How long a sweep's points will take, learned from runs that already trained here.

The first estimate (``plan.estimate_seconds``) times a few plain forward/backward/AdamW steps
per size before anything runs. It misses what only the real runs pay: Lightning's loop and
callbacks per step, the runs sharing the cores, and the tuned batch (a smaller batch is more
steps). After the tune stage, dozens of real runs of the same kind have trained through the
same path and the same launcher, so their wall times are the better guide:

    wall of a run = per_run_s + per_step_s * steps + per_flop_s * training FLOPs

fitted by non-negative least squares (scipy) and applied to the tuned plan's points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from .plan import PlanPoint

MIN_RUNS = 4  # three coefficients: fewer runs would be an exact fit, not an estimate


@dataclass(frozen=True)
class RunTimeModel:
    per_run_s: float  # start-up, final evaluation, checkpoint, MLflow: once per run
    per_step_s: float  # the platform's fixed cost of an optimizer step
    per_flop_s: float  # the model's arithmetic
    n_runs: int  # the runs it was fitted to

    def seconds(self, p: PlanPoint) -> float:
        # a WSD branch trains from its main run's checkpoint: only its own steps count
        return self.per_run_s + self.per_step_s * (p.steps - p.start_step) + self.per_flop_s * p.cost

    def describe(self) -> str:
        return (f"fitted to the wall times of {self.n_runs} tune runs: {self.per_run_s:.1f} s per "
                f"run + {1e3 * self.per_step_s:.2f} ms per step + {1e9 * self.per_flop_s:.3f} s "
                "per GFLOP")


def fit_run_times(runs: pd.DataFrame) -> RunTimeModel | None:
    """The model from finished runs with ``wall_s``, ``steps`` and ``flops`` columns, or None
    when there are too few of them to fit three coefficients."""
    cols = ["wall_s", "steps", "flops"]
    if any(c not in runs for c in cols):
        return None
    ok = runs[cols].apply(pd.to_numeric, errors="coerce").dropna()
    ok = ok[(ok["wall_s"] > 0) & (ok["steps"] > 0)]
    if len(ok) < MIN_RUNS:
        return None
    x = np.column_stack([np.ones(len(ok)), ok["steps"].to_numpy(float), ok["flops"].to_numpy(float)])
    scale = x.max(axis=0)  # steps ~1e3 and FLOPs ~1e11 in one least-squares problem
    coef, _ = nnls(x / scale, ok["wall_s"].to_numpy(float))
    per_run, per_step, per_flop = (coef / scale).tolist()
    return RunTimeModel(per_run, per_step, per_flop, len(ok))
