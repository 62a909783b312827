"""The report's opening section: the forecast against its outcome (table, plot, checks), and
Approach 2's a in each counting convention."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .forecast import exponent_by_convention
from .forecast_stage import allocation_check, grid_check
from .markdown import md_table
from .plot_axes import legible_log_axes

CONVENTION_TEXT = {"non_embedding": "N without embeddings, exact FLOPs",
                   "matmul": "N of the matmuls, exact FLOPs",
                   "total": "total N, exact FLOPs", "total_6nd": "total N, C = 6ND",
                   "all four": "**all four (the interval spans them)**"}


def forecast_md(result: Any, study: pd.DataFrame, out: Path, n_boot: int) -> tuple[list[str], list[Path]]:
    """Markdown lines and the files written into ``out`` (forecast.csv, forecast_runs.csv, the
    plot) for the report's first section."""
    fc = result.forecast
    result.table.to_csv(out / "forecast.csv", index=False)
    result.runs.to_csv(out / "forecast_runs.csv", index=False)
    plot = plot_forecast(result, study, out / "forecast.png")
    trained = ("then trained (`sweep_stage=forecast`)" if not result.runs.empty
               else "not trained (`sweep.forecast_train=false`)")
    md = ["## Forecast vs outcome", "",
          f"Forecast from the study at {', '.join(f'{m:g}x' for m in [t.multiple for t in fc.targets])} "
          f"its largest budget, {trained}. Each interval is 95 %: the seeds' bootstrap, the forms "
          "kept by leave-one-budget-out cross-validation, the four counting conventions, the "
          "forms' error (their cross-validation error, or their forward extrapolation error times "
          "the decades to the target, the larger) and one run's seed noise "
          f"({f'{fc.run_sd:.2%}' if fc.run_sd else 'not measured: one seed per point'}) "
          "(docs/scaling-study.md, *Forecast*).", ""]
    rows = []
    for r in result.table.itertuples():
        t = next(t for t in fc.targets if t.budget == r.budget)
        actual = r.loss_actual
        rows.append({"target": f"{r.budget_multiple:g}x", "C (FLOPs)": f"{r.budget:.3g}",
                     "N* [95 %]": f"{r.N_star:,.0f} [{t.n_lo:,.0f}, {t.n_hi:,.0f}]",
                     "D*": f"{r.D_star:,.0f}", "L* forecast": f"{r.loss_pred:.4f}",
                     "95 % interval": f"[{r.loss_lo:.4f}, {r.loss_hi:.4f}]",
                     "actual": f"{actual:.4f}" if actual == actual else "not trained",
                     "error": f"{actual / r.loss_pred - 1:+.2%}" if actual == actual else "",
                     "covered": ("yes" if r.loss_lo <= actual <= r.loss_hi else "**no**")
                     if actual == actual else ""})
    md += [md_table(pd.DataFrame(rows)), ""]
    runs = result.runs
    if not runs.empty:
        md += ["Every forecast run:", "", md_table(pd.DataFrame([
            {"run": r.run_name, "role": r.role, "N": f"{r.N:,.0f}", "D": f"{r.D:,.0f}",
             "lr": f"{r.lr:.3g}", "batch (tokens)": f"{r.batch:,}",
             "forecast [95 %]": f"{r.loss_pred:.4f} [{r.loss_lo:.4f}, {r.loss_hi:.4f}]"
             if r.loss_pred == r.loss_pred else "– (not the laws' lr and batch)",
             "actual": f"{r.loss_actual:.4f}" if r.loss_actual == r.loss_actual else "failed",
             "error": f"{r.error:+.2%}" if r.error == r.error else "",
             "covered": "" if r.covered is None else ("yes" if r.covered else "**no**")}
            for r in runs.itertuples()])), ""]
    md += _checks_md(result) + task_md(runs)
    cv = ", ".join(f"{k} {v:.2%}" if math.isfinite(v) else f"{k} (too few budgets)"
                   for k, v in fc.cv_error.items())
    md += [f"Cross-validation error of each form (optimal loss at a budget left out, rms): {cv}. "
           + " ".join(n[0].upper() + n[1:] + "." for n in fc.notes), "",
           f"![forecast vs outcome]({plot.name})", ""]
    md += exponent_md(study, n_boot)
    return md, [out / "forecast.csv", out / "forecast_runs.csv", plot]


def _checks_md(result: Any) -> list[str]:
    md = []
    if result.forecast.targets:
        t = result.forecast.targets[0]
        alloc = allocation_check(result.runs, t.budget)
        if alloc is not None:
            md.append(f"- **Allocation at {t.multiple:g}x**: N*'s loss is {alloc[0]:+.2%} against "
                      f"the better of 2N* and N*/2 ({'passes' if alloc[1] else '**fails**'}: "
                      "within +0.5 % or better).")
    grid = grid_check(result.runs)
    if grid is not None:
        md.append(f"- **lr x batch grid around N***: the laws' run is {grid[0]:+.2%} against the "
                  f"grid's best ({grid[1]}); {'within' if grid[0] <= 0.005 else '**outside**'} 0.5 %.")
    return md + ([""] if md else [])


def task_md(runs: pd.DataFrame) -> list[str]:
    """The task accuracy's two-step forecast beside each run's score (none without a task)."""
    if runs.empty or "task_acc_pred" not in runs or runs["task_acc_pred"].isna().all():
        return []
    rows = [{"run": r.run_name, "role": r.role,
             "task loss forecast": f"{r.task_loss_pred:.3f}",
             "task loss actual": f"{r.task_loss_actual:.3f}" if r.task_loss_actual == r.task_loss_actual else "",
             "accuracy forecast [95 %]": f"{r.task_acc_pred:.3f} [{r.task_acc_lo:.3f}, {r.task_acc_hi:.3f}]",
             "actual": f"{r.task_acc_actual:.3f}" if r.task_acc_actual == r.task_acc_actual else "",
             "error": f"{r.task_acc_actual - r.task_acc_pred:+.3f}" if r.task_acc_actual == r.task_acc_actual else "",
             "covered": "" if r.task_covered is None else ("yes" if r.task_covered else "**no**")}
            for r in runs.itertuples() if r.task_acc_pred == r.task_acc_pred]
    return ["### Task accuracy: a two-step forecast", "",
            "Pick the right ending of a held-out line among four (chance 0.25). Step 1: the loss "
            "forecast above, through the line from held-out loss to task loss fitted on the study; "
            "step 2: accuracy from task loss, in the form that best forecast the study's largest "
            "budget from the rest. The interval spans the three accuracy forms over step 1's "
            "interval, plus the items' sampling error (docs/scaling-study.md, *Task forecast*).",
            "", md_table(pd.DataFrame(rows)), ""]


def exponent_md(study: pd.DataFrame, n_boot: int) -> list[str]:
    """Approach 2's a in each counting convention (seed bootstrap), and the span of all four."""
    table = exponent_by_convention(study[study["stage"] == "main"] if "stage" in study else study,
                                   n_boot=max(n_boot, 20))
    rows = [{"convention": CONVENTION_TEXT.get(r.convention, r.convention),
             "a (N* ∝ C^a)": f"{r.a:.3f}", "95 % interval": f"[{r.a_lo:.3f}, {r.a_hi:.3f}]",
             "half-width": f"±{(r.a_hi - r.a_lo) / 2:.3f}"} for r in table.itertuples()]
    return ["### a in four counting conventions", "",
            "Approach 2 through the IsoFLOP minima (unweighted), the seeds resampled; the last row "
            "is the interval that includes the convention's choice.", "", md_table(pd.DataFrame(rows)), ""]


def plot_forecast(result: Any, study: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .forecast import convention_points, point_means
    from .forecast_forms import budget_minima

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    means = point_means(study[study["stage"] == "main"] if "stage" in study else study)
    pts = convention_points(means, result.forecast.n_convention)
    ax.scatter(pts["c"], pts["loss"], s=8, color="0.7", label="study points (seed means)")
    m = budget_minima(pts)
    ax.scatter(m["c"], m["loss"], s=30, color="C0", label="study IsoFLOP minima", zorder=3)
    colours = {"optimum": "C3", "larger": "C2", "smaller": "C1"}
    for t in result.forecast.targets:
        for i, r in enumerate(t.runs):
            x = t.budget * (1.0 + 0.08 * (i - 1))
            ax.errorbar([x], [r.loss_pred], yerr=[[r.loss_pred - r.loss_lo], [r.loss_hi - r.loss_pred]],
                        fmt="o", mfc="none", color=colours[r.role], capsize=3,
                        label=f"forecast: {r.role}" if t is result.forecast.targets[0] else None)
            got = result.runs[(result.runs["budget"] == t.budget) & (result.runs["role"] == r.role)]
            if len(got) and np.isfinite(got["loss_actual"].iloc[0]):
                ax.scatter([x], [got["loss_actual"].iloc[0]], marker="x", s=50, color=colours[r.role],
                           zorder=4, label="actual" if t is result.forecast.targets[0] and i == 0 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel("held-out loss")
    ax.set_title("forecast (95 % intervals) vs outcome")
    legible_log_axes(ax, x=True, y=True)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
