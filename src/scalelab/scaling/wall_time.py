"""How long a sweep's points will take: timed per shape before anything runs, then learned from
runs that already trained here.

The first estimate (``estimate_seconds``) times a few plain forward/backward/AdamW steps per
shape (``measure_flops_per_s``) before anything runs. It misses what only the real runs pay:
Lightning's loop and callbacks per step, the runs sharing the cores, and the tuned batch (a
smaller batch is more steps). After the tune stage, dozens of real runs of the same kind have
trained through the same path and the same launcher, so their wall times are the better guide:

    wall of a run = per_run_s + per_step_s * steps + per_flop_s * training FLOPs

fitted by non-negative least squares (scipy) and applied to the tuned plan's points.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from scalelab.model.config import ModelConfig

from .plan import Plan, PlanPoint

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


def measure_flops_per_s(plan: Plan, micro_batch: int, time_budget_s: float = 8.0,
                        threads: int | None = None) -> dict[tuple[int, int, str], float]:
    """Achieved training FLOP/s of each distinct shape: a few forward+backward+AdamW steps.

    Sizes are timed from smallest to largest until ``time_budget_s`` is spent; the rest get
    the FLOP/s of the largest shape measured (larger matmuls are at least as efficient). One
    noisy measurement (a busy machine) is clamped to within 3x of the median.
    """
    import torch
    import torch.nn.functional as F

    from scalelab.model import Transformer

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    shapes: dict[tuple[int, int, str], PlanPoint] = {}
    for p in sorted(plan.points, key=lambda q: q.n_params_matmul):
        shapes.setdefault((p.n_layers, p.d_model, p.variant), p)
    out: dict[tuple[int, int, str], float] = {}
    start, last = time.perf_counter(), None
    try:
        for key, p in shapes.items():
            if last is not None and time.perf_counter() - start > time_budget_s:
                out[key] = last
                continue
            cfg = ModelConfig.from_dict(plan.base_model | p.model_overrides)
            model = Transformer(cfg)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randint(0, cfg.vocab_size, (micro_batch, plan.seq_len))
            times = []
            for i in range(6):
                t0 = time.perf_counter()
                logits = model(x)
                F.cross_entropy(logits.flatten(0, 1), x.flatten()).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if i:  # the first step pays for allocations
                    times.append(time.perf_counter() - t0)
                if i >= 2 and sum(times) > 0.3:
                    break
            dt = sorted(times)[len(times) // 2]
            last = out[key] = p.flops_per_token * micro_batch * plan.seq_len / dt
    finally:
        torch.set_num_threads(old_threads)
    med = sorted(out.values())[len(out) // 2]
    return {k: min(max(v, med / 3), med * 3) for k, v in out.items()}


def estimate_seconds(plan: Plan, flops_per_s: dict[tuple[int, int, str], float],
                     overhead_s: float = 0.0,
                     score_s: dict[tuple[int, int, str], float] | None = None) -> list[float]:
    """Estimated wall time of each point: its own FLOPs / measured FLOP/s + a start-up cost
    (+ the held-out scoring of its checkpoint, ``score_s`` per shape, when the sweep scores)."""
    score_s = score_s or {}
    return [p.cost / flops_per_s[key] + overhead_s + score_s.get(key, 0.0)
            for p in plan.points for key in [(p.n_layers, p.d_model, p.variant)]]
