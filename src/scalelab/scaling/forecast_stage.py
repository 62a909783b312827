"""The sweep's forecast stage: forecast beyond the study, train the forecast runs, score them.

After the study's points are collected, scaling/forecast.py forecasts N*, D* and the loss of
N*, 2 N* and N*/2 at each of ``sweep.forecast_multiples`` x the largest budget. Those runs are
then trained as ordinary sweep points (children of the parent, ``sweep_stage=forecast``) with
the study's hyperparameter laws, and the forecast goes onto each child as tags *before* it
trains. An optional lr x batch grid around N* at the first multiple tests the laws there.
``forecast.csv`` (one row per target budget) and ``forecast_runs.csv`` (one per run) land in
<sweep>/forecast and in the report folder, whose report opens with them. With a task
(``sweep.task_items``), each run's task accuracy is forecast too (scaling/task_forecast.py),
tagged before it trains, and scored beside its loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scalelab.data.files import atomic_write_text
from scalelab.model.config import ModelConfig
from scalelab.tracking.params import accounting

from .forecast import Forecast, ForecastRun, Target, make_forecast
from .plan import Plan, PlanPoint, save_plan
from .planner import planned_point
from .shape_search import shape_for

FORECAST_COLUMNS = ["budget_multiple", "budget", "N_star", "D_star", "loss_pred", "loss_lo",
                    "loss_hi", "loss_actual"]
RUN_COLUMNS = ["budget_multiple", "budget", "role", "lr_factor", "batch_factor", "N", "D", "lr",
               "batch", "loss_pred", "loss_lo", "loss_hi", "loss_actual", "error", "covered",
               "run_name", "task_loss_pred", "task_loss_actual", "task_acc_pred", "task_acc_lo",
               "task_acc_hi", "task_acc_actual", "task_covered"]
TASK_CHANCE = 0.25  # four endings to choose among (scaling/task_metric.py)
MIN_BUDGETS = 3  # leave-one-budget-out cross-validation needs >= 2 budgets left to fit


@dataclass
class ForecastResult:
    forecast: Forecast
    table: pd.DataFrame  # FORECAST_COLUMNS, one row per target budget
    runs: pd.DataFrame  # one row per forecast run (the grid's too), forecast beside outcome
    failed: dict[str, str]
    study: pd.DataFrame  # the study's runs the forecast was made from


def forecast_skip_reason(plan: Plan) -> str:
    """Why this plan gets no forecast ("" when it does)."""
    spec = plan.spec
    if not spec.forecast_multiples:
        return ""
    if len(spec.budgets) < MIN_BUDGETS:
        return (f"forecast skipped: it needs >= {MIN_BUDGETS} budgets to cross-validate its "
                f"forms (sweep.budgets has {len(spec.budgets)})")
    if len(plan.variants) > 1:
        return "forecast skipped: it forecasts a study of one variant (this one has several)"
    if spec.wsd:
        return ("forecast skipped: a WSD study's forecast runs would need cooldown branches of "
                "their own; set sweep.wsd=false to forecast")
    return ""


def run_forecast_stage(plan: Plan, study: pd.DataFrame, settings: Any, base: Any,
                       sweep_dir: Path, parent: Any, scorer: Any,
                       echo: Callable[[str], None]) -> ForecastResult | None:
    """Forecast from ``study`` (the collected main runs), train the forecast runs when
    sweep.forecast_train is set, and write forecast.csv; None when the plan has no forecast."""
    from .collect import collect
    from .launch import SweepRunner

    spec = plan.spec
    if not spec.forecast_multiples or forecast_skip_reason(plan):
        return None
    shapes = _ShapeMaker(plan)
    finished = study[study["stage"] == "main"] if "stage" in study else study
    echo(f"forecast: fitting 4 forms x 4 counting conventions to {len(finished)} runs "
         f"({settings.bootstrap} bootstrap resamples)")
    fc = make_forecast(finished, spec.forecast_multiples, shapes.counts, spec.n_convention,
                       n_boot=settings.bootstrap)
    for line in _forecast_lines(fc):
        echo(f"forecast: {line}")
    task = task_forecaster(finished, settings, fc, echo)
    points = forecast_points(plan, fc, shapes) if spec.forecast_train else []
    points = _with_task_tags(points, task)
    failed: dict[str, str] = {}
    if points:
        fplan = dataclasses.replace(plan, points=points)
        for path in save_plan(fplan, sweep_dir / "forecast").values():
            parent.log_artifact(path, "forecast")
        echo(f"forecast stage: training {len(points)} runs, {fplan.total_compute:.3g} FLOPs")
        outcome = SweepRunner(fplan, spec, settings, base, sweep_dir, parent, echo=echo,
                              on_finished=scorer).run()
        failed = dict(outcome.failed)
        if scorer is not None:
            scorer.score_all(points)
    got = collect(parent, spec.n_convention, settings.flops_convention, curves=False,
                  point_ids={p.point_id for p in points}).runs if points else pd.DataFrame()
    runs = outcome_table(points, got)
    table = target_table(fc, runs)
    folder = sweep_dir / "forecast"  # the report copies both beside report.md
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "forecast.csv", table.to_csv(index=False))
    atomic_write_text(folder / "forecast_runs.csv", runs.to_csv(index=False))
    for name in ("forecast.csv", "forecast_runs.csv"):
        parent.log_artifact(folder / name, "forecast")
    _log_outcomes(parent, runs, table,
                  dict(zip(got["point"], got["run_id"], strict=True)) if points else {})
    return ForecastResult(fc, table, runs, failed, finished)


class _ShapeMaker:
    """The family's shape nearest a target N, as counts (forecast.Shape) and as ModelConfig."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.configs: dict[tuple[int, int], ModelConfig] = {}

    def config(self, n: float) -> ModelConfig:
        cfg = shape_for(n, self.plan.family, self.plan.base_model, self.plan.spec.n_convention)
        return self.configs.setdefault((cfg.n_layers, cfg.d_model), cfg)

    def counts(self, n: float) -> dict[str, float]:
        acc = accounting(self.config(n), self.plan.seq_len)
        return {k: float(acc[k]) for k in ("n_params", "n_params_non_embedding",
                                            "n_params_matmul", "flops_per_token")}


def forecast_points(plan: Plan, fc: Forecast, shapes: _ShapeMaker) -> list[PlanPoint]:
    """The runs that test the forecast: N*, 2 N*, N*/2 at every target, at the study's laws,
    plus the lr x batch grid around N* at the first target; one seed each."""
    spec = plan.spec
    points = []
    for t in fc.targets:
        for run in t.runs:
            cfg = shapes.config(run.shape["n_params_matmul"])
            points.append(_as_forecast(planned_point(plan, cfg, t.budget), t, run))
    out = dataclasses.replace(plan, points=points, lr_law=plan.lr_law)
    out = _with_laws(out)
    grid = []
    first = fc.targets[0]
    centre = next(p for p in out.points if p.budget == first.budget and p.forecast_role == "optimum")
    for lf in spec.forecast_lr_factors or [1.0]:
        for bf in spec.forecast_batch_factors or [1.0]:
            if lf == 1.0 and bf == 1.0:
                continue
            p = out.at_batch(centre, max(1, round(centre.tokens_per_step / plan.seq_len * bf)))
            # no loss forecast on a grid run: the forecast assumes the laws' lr and batch
            tags = {"forecast_role": "grid", "forecast_multiple": f"{first.multiple:g}"}
            grid.append(dataclasses.replace(p, lr=centre.lr * lf, lr_factor=lf, batch_factor=bf,
                                            forecast_role="grid", forecast_tags=tags))
    final = dataclasses.replace(out, points=out.points + grid)
    final.finalize()
    return final.points


def _with_laws(plan: Plan) -> Plan:
    """The forecast runs at the study's hyperparameters: its tuned laws, or its lr law."""
    if plan.tuned:
        return plan.with_hparams(plan.tuned)
    if plan.lr_law:
        return plan.with_lr_law(**plan.lr_law)
    plan.finalize()
    return plan


def _as_forecast(p: PlanPoint, t: Target, run: ForecastRun) -> PlanPoint:
    return dataclasses.replace(
        p, stage="forecast", forecast_role=run.role, forecast_multiple=t.multiple,
        forecast_tags={"forecast_loss_pred": f"{run.loss_pred:.5f}",
                       "forecast_loss_lo": f"{run.loss_lo:.5f}",
                       "forecast_loss_hi": f"{run.loss_hi:.5f}",
                       "forecast_role": run.role, "forecast_multiple": f"{t.multiple:g}"})


def task_forecaster(study: pd.DataFrame, settings: Any, fc: Forecast,
                    echo: Callable[[str], None]) -> Any:
    """The task's two-step forecaster fitted on the study's runs, its forecast of every target
    run said on the console; None without a task or with too few runs scored on it."""
    from .task_forecast import ACC_FORMS, MIN_RUNS, fit_task_forecaster

    if not settings.task_items or "task_acc" not in study:
        return None
    tf = fit_task_forecaster(study, TASK_CHANCE, settings.task_items)
    if tf is None:
        echo(f"task forecast skipped: fewer than {MIN_RUNS} of the study's runs have a task score")
        return None
    cv = ", ".join(f"{f} {tf.cv_error.get(f, math.nan):.3f}" for f in ACC_FORMS)
    echo(f"task forecast: task loss = {tf.line[0]:.3f} + {tf.line[1]:.3f} x loss; accuracy form "
         f"{tf.best} (error on the largest budget, fitted without it: {cv})")
    for t in fc.targets:
        for run in t.runs:
            f = tf.forecast(run.loss_pred, run.loss_lo, run.loss_hi)
            echo(f"task forecast {t.multiple:g}x {run.role}: accuracy {f['task_acc_pred']:.3f} "
                 f"[{f['task_acc_lo']:.3f}, {f['task_acc_hi']:.3f}]")
    return tf


def _with_task_tags(points: list[PlanPoint], tf: Any) -> list[PlanPoint]:
    """``points`` with the task forecast of each run that has a loss forecast in its tags."""
    if tf is None:
        return points
    out = []
    for p in points:
        tags = p.forecast_tags
        if "forecast_loss_pred" in tags:
            f = tf.forecast(*(float(tags[f"forecast_loss_{k}"]) for k in ("pred", "lo", "hi")))
            tags = tags | {f"forecast_{k}": f"{v:.5f}" for k, v in f.items()}
        out.append(dataclasses.replace(p, forecast_tags=tags))
    return out


def outcome_table(points: list[PlanPoint], got: pd.DataFrame) -> pd.DataFrame:
    """One row per forecast run: what was forecast and what it trained to."""
    loss = dict(zip(got["point_id"], got["loss"], strict=True)) if not got.empty else {}
    task = {k: dict(zip(got["point_id"], got[k], strict=True))
            for k in ("task_loss", "task_acc") if k in got}
    rows = []
    for p in points:
        pred = float(p.forecast_tags.get("forecast_loss_pred", "nan"))
        lo = float(p.forecast_tags.get("forecast_loss_lo", "nan"))
        hi = float(p.forecast_tags.get("forecast_loss_hi", "nan"))
        actual = float(loss.get(p.point_id, math.nan))
        rows.append({"budget_multiple": p.forecast_multiple, "budget": p.budget, "role": p.forecast_role,
                     "lr_factor": p.lr_factor, "batch_factor": p.batch_factor,
                     "N": p.n_params_matmul, "D": p.tokens, "lr": p.lr,
                     "batch": p.tokens_per_step, "loss_pred": pred, "loss_lo": lo, "loss_hi": hi,
                     "loss_actual": actual, "error": actual / pred - 1 if pred == pred else math.nan,
                     "covered": bool(lo <= actual <= hi) if actual == actual and lo == lo else None,
                     "run_name": p.name, **_task_outcome(p, task)})
    return pd.DataFrame(rows, columns=RUN_COLUMNS)  # the columns even with no run trained


def _task_outcome(p: PlanPoint, task: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The run's task forecast (its tags) beside its task score; NaN where either is missing."""
    def tag(key: str) -> float:
        return float(p.forecast_tags.get(f"forecast_{key}", "nan"))

    acc = float(task.get("task_acc", {}).get(p.point_id, math.nan))
    lo, hi = tag("task_acc_lo"), tag("task_acc_hi")
    return {"task_loss_pred": tag("task_loss_pred"),
            "task_loss_actual": float(task.get("task_loss", {}).get(p.point_id, math.nan)),
            "task_acc_pred": tag("task_acc_pred"), "task_acc_lo": lo, "task_acc_hi": hi,
            "task_acc_actual": acc,
            "task_covered": bool(lo <= acc <= hi) if acc == acc and lo == lo else None}


def target_table(fc: Forecast, runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for t in fc.targets:
        opt = t.runs[0]
        actual = math.nan
        if not runs.empty:
            hit = runs[(runs["budget"] == t.budget) & (runs["role"] == "optimum")]
            actual = float(hit["loss_actual"].iloc[0]) if len(hit) else math.nan
        rows.append({"budget_multiple": t.multiple, "budget": t.budget, "N_star": t.n_star,
                     "D_star": t.d_star, "loss_pred": opt.loss_pred, "loss_lo": opt.loss_lo,
                     "loss_hi": opt.loss_hi, "loss_actual": actual})
    return pd.DataFrame(rows, columns=FORECAST_COLUMNS)


def allocation_check(runs: pd.DataFrame, budget: float) -> tuple[float, bool] | None:
    """At ``budget``: N*'s loss relative to the better of its 2x / 0.5x neighbours, and whether
    it is within 0.5 % of it or beats both; None without all three outcomes."""
    at = runs[(runs["budget"] == budget) & runs["role"].isin(["optimum", "larger", "smaller"])]
    if len(at) < 3 or at["loss_actual"].isna().any():
        return None
    by = dict(zip(at["role"], at["loss_actual"], strict=True))
    rel = by["optimum"] / min(by["larger"], by["smaller"]) - 1
    return float(rel), bool(rel <= 0.005)


def grid_check(runs: pd.DataFrame) -> tuple[float, str] | None:
    """The laws' run against the lr x batch grid's best: (relative excess, best cell)."""
    grid = runs[runs["role"].isin(["optimum", "grid"]) & runs["loss_actual"].notna()]
    first = runs["budget"].min() if not runs.empty else None
    grid = grid[grid["budget"] == first]
    if (grid["role"] == "grid").sum() == 0 or (grid["role"] == "optimum").sum() == 0:
        return None
    law = float(grid[grid["role"] == "optimum"]["loss_actual"].iloc[0])
    best = grid.loc[grid["loss_actual"].idxmin()]
    cell = f"lr x{best['lr_factor']:g}, batch x{best['batch_factor']:g}"
    return law / float(best["loss_actual"]) - 1, cell


def _forecast_lines(fc: Forecast) -> list[str]:
    cv = ", ".join(f"{k} {v:.2%}" if math.isfinite(v) else f"{k} -" for k, v in fc.cv_error.items())
    lines = [f"cross-validation error (leave one budget out): {cv}", *fc.notes]
    for t in fc.targets:
        opt = t.runs[0]
        lines.append(f"{t.multiple:g}x ({t.budget:.3g} FLOPs): N* = {t.n_star:,.0f} "
                     f"[{t.n_lo:,.0f}, {t.n_hi:,.0f}], D* = {t.d_star:,.0f}, L* = "
                     f"{opt.loss_pred:.4f} [{opt.loss_lo:.4f}, {opt.loss_hi:.4f}]")
    return lines


def summary_lines(result: ForecastResult) -> list[str]:
    """The console's lines: each target's forecast against its outcome, and the checks."""
    lines = []
    for r in result.table.itertuples():
        got = (f"actual {r.loss_actual:.4f} ({r.loss_actual / r.loss_pred - 1:+.2%}, "
               f"{'covered' if r.loss_lo <= r.loss_actual <= r.loss_hi else 'NOT covered'})"
               if r.loss_actual == r.loss_actual else "not trained")
        lines.append(f"forecast {r.budget_multiple:g}x: L* {r.loss_pred:.4f} "
                     f"[{r.loss_lo:.4f}, {r.loss_hi:.4f}], {got}")
    if result.forecast.targets:
        alloc = allocation_check(result.runs, result.forecast.targets[0].budget)
        if alloc is not None:
            lines.append(f"allocation at {result.forecast.targets[0].multiple:g}x: N* is "
                         f"{alloc[0]:+.2%} against the better neighbour "
                         f"({'passes' if alloc[1] else 'fails'}: <= +0.5 %)")
    for r in result.runs.itertuples():
        if r.task_acc_actual == r.task_acc_actual and r.task_acc_pred == r.task_acc_pred:
            lines.append(f"task forecast {r.budget_multiple:g}x {r.role}: accuracy "
                         f"{r.task_acc_pred:.3f} [{r.task_acc_lo:.3f}, {r.task_acc_hi:.3f}], "
                         f"actual {r.task_acc_actual:.3f} ({r.task_acc_actual - r.task_acc_pred:+.3f}, "
                         f"{'covered' if r.task_covered else 'NOT covered'})")
    grid = grid_check(result.runs)
    if grid is not None:
        lines.append(f"lr x batch grid: the laws' run is {grid[0]:+.2%} against the grid's best "
                     f"({grid[1]})")
    return lines


def _log_outcomes(parent: Any, runs: pd.DataFrame, table: pd.DataFrame,
                  ids: dict[str, str]) -> None:
    """Outcome metrics on every forecast child (its forecast went on as tags at launch; ``ids``:
    point name -> its finished run, as collected) and the per-target numbers on the parent."""
    for r in runs.itertuples():
        if ids.get(r.run_name) and r.loss_actual == r.loss_actual:
            parent.log_child_metrics(ids[r.run_name], {
                "forecast/loss_pred": r.loss_pred, "forecast/loss_lo": r.loss_lo,
                "forecast/loss_hi": r.loss_hi, "forecast/error": r.error,
                "forecast/covered": float(bool(r.covered))})
        if ids.get(r.run_name) and r.task_acc_actual == r.task_acc_actual \
                and r.task_acc_pred == r.task_acc_pred:
            parent.log_child_metrics(ids[r.run_name], {
                "forecast/task_acc_pred": r.task_acc_pred, "forecast/task_acc_lo": r.task_acc_lo,
                "forecast/task_acc_hi": r.task_acc_hi,
                "forecast/task_covered": float(bool(r.task_covered))})
    metrics = {}
    for r in table.itertuples():
        key = f"forecast/{r.budget_multiple:g}x"
        metrics |= {f"{key}/loss_pred": r.loss_pred, f"{key}/loss_lo": r.loss_lo,
                    f"{key}/loss_hi": r.loss_hi, f"{key}/N_star": r.N_star}
        if r.loss_actual == r.loss_actual:
            metrics |= {f"{key}/loss_actual": r.loss_actual,
                        f"{key}/error": r.loss_actual / r.loss_pred - 1,
                        f"{key}/covered": float(r.loss_lo <= r.loss_actual <= r.loss_hi)}
    parent.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)})
