"""A two-step forecast of the line-ending task's accuracy (scaling/task_metric.py).

Step 1, (N, D) -> task loss: the study's loss forecast for the run (scaling/forecast.py, with
its interval over seeds, forms and counting conventions) goes through the straight line from
held-out loss to task loss fitted on the study's runs (both are losses of the same model on the
same held-out text, so the line is tight).
Step 2, task loss -> accuracy, with three forms fitted on the study's runs:
- ``linear``: acc = a + b L;
- ``logistic``: acc = chance + (1 - chance) sigmoid(k (L0 - L)) (a perfect model is right);
- ``logistic_top``: the same with its ceiling fitted too (Bhagia et al. 2024).
A study sees only the low end of the accuracy curve, where the three agree, and they part
beyond it. The point forecast takes the form with the smallest error when the study's largest
budget is left out and forecast from the rest; the interval spans every form over step 1's
interval, widened by the outcome's own sampling error (binomial, the items counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

ACC_FORMS = ("linear", "logistic", "logistic_top")
MIN_RUNS = 6  # fewer runs than this with a task score: no task forecast
Z95 = 1.959964


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def fit_accuracy(form: str, task_loss: np.ndarray, acc: np.ndarray,
                 chance: float) -> Callable[[np.ndarray], np.ndarray] | None:
    """acc(task loss) in ``form``, or None where it does not converge."""
    x, y = np.asarray(task_loss, float), np.asarray(acc, float)
    if form == "linear":
        b, a = np.polyfit(x, y, 1)
        return lambda t: a + b * np.asarray(t, float)
    mid = float(np.median(x))
    try:
        if form == "logistic":
            (k, l0), _ = curve_fit(lambda t, k, l0: chance + (1 - chance) * _sigmoid(k * (l0 - t)),
                                   x, y, p0=[1.0, mid], maxfev=20000)
            return lambda t: chance + (1 - chance) * _sigmoid(k * (l0 - np.asarray(t, float)))
        if form == "logistic_top":
            def f(t, top, k, l0):
                return chance + (top - chance) * _sigmoid(k * (l0 - t))
            (top, k, l0), _ = curve_fit(f, x, y, p0=[min(1.0, y.max() + 0.1), 2.0, mid],
                                        bounds=([chance, 1e-3, -np.inf], [1.0, 100.0, np.inf]),
                                        maxfev=20000)
            return lambda t: f(np.asarray(t, float), top, k, l0)
    except (RuntimeError, ValueError):
        return None
    raise ValueError(f"accuracy form {form!r}: choose one of {', '.join(ACC_FORMS)}")


@dataclass
class TaskForecaster:
    """The fitted steps: task loss = a + b * held-out loss, and acc(task loss) per form."""

    line: tuple[float, float]
    forms: dict[str, Callable[[np.ndarray], np.ndarray]]
    cv_error: dict[str, float]  # RMSE of each form on the largest budget, fitted without it
    best: str
    chance: float
    items: int

    def task_loss(self, loss: float) -> float:
        return float(self.line[0] + self.line[1] * loss)

    def forecast(self, loss_pred: float, loss_lo: float, loss_hi: float) -> dict[str, float]:
        """Task loss and accuracy, each with a 95 % interval, from the loss forecast."""
        t_pred, t_lo, t_hi = (self.task_loss(v) for v in (loss_pred, loss_lo, loss_hi))
        t_lo, t_hi = min(t_lo, t_hi), max(t_lo, t_hi)
        acc = float(self.forms[self.best](t_pred))
        ends = [float(f(t)) for f in self.forms.values() for t in (t_lo, t_pred, t_hi)]
        lo, hi = min(ends), max(ends)
        noise = Z95 * math.sqrt(max(acc * (1 - acc), 1e-12) / max(self.items, 1))
        return {"task_loss_pred": t_pred, "task_loss_lo": t_lo, "task_loss_hi": t_hi,
                "task_acc_pred": acc, "task_acc_lo": max(0.0, lo - noise),
                "task_acc_hi": min(1.0, hi + noise)}


def fit_task_forecaster(study: pd.DataFrame, chance: float, items: int) -> TaskForecaster | None:
    """From the study's runs (columns loss, task_loss, task_acc, budget); None with fewer than
    MIN_RUNS scored runs."""
    pts = study.dropna(subset=["loss", "task_loss", "task_acc"])
    if len(pts) < MIN_RUNS:
        return None
    b, a = np.polyfit(pts["loss"].to_numpy(float), pts["task_loss"].to_numpy(float), 1)
    x, y = pts["task_loss"].to_numpy(float), pts["task_acc"].to_numpy(float)
    forms = {f: fit for f in ACC_FORMS if (fit := fit_accuracy(f, x, y, chance)) is not None}
    if not forms:
        return None
    cv = _leave_top_budget_out(pts, chance)
    best = min(forms, key=lambda f: cv.get(f, math.inf))
    return TaskForecaster((float(a), float(b)), forms, cv, best, chance, items)


def _leave_top_budget_out(pts: pd.DataFrame, chance: float) -> dict[str, float]:
    """Each form's RMSE on the largest budget's runs when fitted on the others' (the direction
    a forecast goes); NaN when too few runs are left to fit."""
    top = pts["budget"].max()
    train, test = pts[pts["budget"] < top], pts[pts["budget"] == top]
    out = {}
    for form in ACC_FORMS:
        fit = fit_accuracy(form, train["task_loss"], train["task_acc"], chance) \
            if len(train) >= MIN_RUNS - 2 else None
        err = fit(test["task_loss"].to_numpy(float)) - test["task_acc"].to_numpy(float) \
            if fit is not None else np.array([np.nan])
        out[form] = float(np.sqrt(np.mean(err**2)))
    return out
