"""Forecast runs beyond a study: N*, D* and the loss at budgets ``multiples`` x the largest.

For each target budget C (exact FLOPs, as the study's budgets):
1. Every form of scaling/forecast_forms.py is fitted on the study's point means in each of four
   counting conventions (N without embeddings, N of the matmuls, total N, and total N with
   C = 6ND; ``CONVENTIONS``).
2. Leave-one-budget-out cross-validation scores each form: refitted without a budget, how far
   is it from that budget's best measured points (rms relative error). Forms within
   ``FORM_TOLERANCE`` of the best score are kept.
3. N* is the geometric mean of the kept forms' optima in the sweep's convention; the runs to
   train are the family's shapes nearest N*, 2 N* and N*/2 at D = C / FLOPs per token.
4. Each run's loss is forecast as the kept forms' mean. Its 95 % interval is the envelope of
   the kept forms' bootstrap intervals (the points' seeds resampled) over all four
   conventions, widened in quadrature by the forms' own error and by one run's seed noise (the
   outcome is one seed). The forms' error is the larger of their cross-validation error (what
   they miss on a budget they did not see) and the forecast's forward extrapolation error per
   decade (the kept forms fitted below each budget, their mean scored on it) times the decades
   to the target: an error that grows with the distance of the forecast. Where every backtest
   ran high (or low), the notes say the forecast most likely does too.

Pure numpy/pandas: the sweep (scaling/forecast_stage.py) supplies the shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from .forecast_forms import FORMS, budget_minima, fit_form

# name -> (the runs' N column, C = 6ND instead of the exact FLOPs)
CONVENTIONS: dict[str, tuple[str, bool]] = {
    "non_embedding": ("n_params_non_embedding", False),
    "matmul": ("n_params_matmul", False),
    "total": ("n_params", False),
    "total_6nd": ("n_params", True),
}
N_COLUMNS = {"non_embedding": "n_params_non_embedding", "matmul": "n_params_matmul",
             "total": "n_params"}
# a form is kept when its cross-validation error is within 2x the best form's (or 0.25 %, about
# one point's held-out noise, above it: two forms that both fit to the noise are both kept)
FORM_TOLERANCE = (2.0, 0.0025)
CV_POINTS = 3  # a left-out budget is scored on its lowest-loss points
ROLES = {"optimum": 1.0, "larger": 2.0, "smaller": 0.5}  # the runs trained at each target
Shape = dict[str, float]  # n_params, n_params_non_embedding, n_params_matmul, flops_per_token


@dataclass
class ForecastRun:
    role: str  # optimum | larger | smaller
    shape: Shape
    tokens: float
    loss_pred: float
    loss_lo: float
    loss_hi: float
    by_form: dict[str, float]  # each kept form's forecast in the sweep's convention


@dataclass
class Target:
    multiple: float
    budget: float
    n_star: float  # in the sweep's N convention
    n_lo: float
    n_hi: float
    d_star: float
    runs: list[ForecastRun]


@dataclass
class Forecast:
    targets: list[Target]
    cv_error: dict[str, float]  # form -> leave-one-budget-out rms relative error (sweep's convention)
    kept: list[str]
    run_sd: float  # one run's relative seed noise (median over the points)
    n_convention: str
    notes: list[str] = field(default_factory=list)
    per_decade: float = 0.0  # the forecast's forward extrapolation error per decade of compute


def point_means(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per point (its seeds averaged): budget, the N columns, D, flops_per_token, loss
    and ``losses`` (each seed's)."""
    key = "group_id" if "group_id" in runs else "point_id"
    cols = ["budget", "n_params", "n_params_non_embedding", "n_params_matmul", "D",
            "flops_per_token"]
    g = runs.groupby(key, sort=True)
    out = g[cols].first()
    out["losses"] = g["loss"].apply(lambda s: s.to_numpy(float))
    out["loss"] = out["losses"].apply(np.mean)
    return out.reset_index(drop=True)


def convention_points(means: pd.DataFrame, convention: str) -> pd.DataFrame:
    """The points as the forms see them: budget, n, d, c, loss in one counting convention."""
    col, six_nd = CONVENTIONS[convention]
    d = means["D"].to_numpy(float)
    c = 6.0 * means[col].to_numpy(float) * d if six_nd else means["flops_per_token"] * d
    return pd.DataFrame({"budget": means["budget"], "n": means[col], "d": d, "c": c,
                         "loss": means["loss"]})


def run_noise(means: pd.DataFrame) -> float:
    """Median relative seed standard deviation of the points with >= 2 seeds (0 without)."""
    sd = [np.std(x, ddof=1) / np.mean(x) for x in means["losses"] if len(x) > 1]
    return float(np.median(sd)) if sd else 0.0


@dataclass
class _Maps:
    """Power laws in the sweep's N (fitted on the points) for the continuous optimum search:
    each convention's N and the exact FLOPs per token."""

    n_coef: dict[str, np.ndarray]
    fpt_coef: np.ndarray
    log_n_range: tuple[float, float]

    @classmethod
    def fit(cls, means: pd.DataFrame, primary: str) -> _Maps:
        x = np.log(means[N_COLUMNS[primary]].to_numpy(float))
        coef = {k: np.polyfit(x, np.log(means[col].to_numpy(float)), 1)
                for k, col in N_COLUMNS.items()}
        fpt = np.polyfit(x, np.log(means["flops_per_token"].to_numpy(float)), 1)
        return cls(coef, fpt, (float(x.min()), float(x.max())))

    def loss(self, form: Any, convention: str, log_n: float, budget: float) -> float:
        col, six_nd = CONVENTIONS[convention]
        key = next(k for k, c in N_COLUMNS.items() if c == col)
        n = math.exp(np.polyval(self.n_coef[key], log_n))
        d = budget / math.exp(np.polyval(self.fpt_coef, log_n))
        c = 6.0 * n * d if six_nd else budget
        return float(form.loss(n, d, c))

    def optimum(self, form: Any, convention: str, budget: float, reach: float) -> float:
        """ln N* (sweep's convention) minimising the form's loss at ``budget``."""
        lo, hi = self.log_n_range
        res = minimize_scalar(lambda x: self.loss(form, convention, x, budget),
                              bounds=(lo - 3.0, hi + math.log(reach) + 3.0), method="bounded")
        return float(res.x)


def shape_loss(form: Any, convention: str, shape: Shape, budget: float) -> float:
    """A form's loss for a concrete shape trained at ``budget`` FLOPs."""
    col, six_nd = CONVENTIONS[convention]
    d = budget / shape["flops_per_token"]
    n = shape[col]
    return float(form.loss(n, d, 6.0 * shape["n_params"] * d if six_nd else budget))


def _errors_at(forms: list[Any], held: pd.DataFrame) -> np.ndarray:
    """Relative error of the forms' mean loss at a budget's ``CV_POINTS`` best measured points."""
    best = held.nsmallest(CV_POINTS, "loss")
    pred = np.mean([f.loss(best["n"], best["d"], best["c"]) for f in forms], axis=0)
    return pred / best["loss"].to_numpy(float) - 1.0


def cross_validate(means: pd.DataFrame, convention: str) -> dict[str, float]:
    """Per form: refitted without each budget in turn, the rms relative error of its loss at
    that budget's ``CV_POINTS`` best points (the optimum's neighbourhood, measured: no form's
    own idea of the minimum is the reference); inf where fewer than 2 budgets could be scored."""
    pts = convention_points(means, convention)
    out = {}
    for name in FORMS:
        errs: list[float] = []
        scored = 0
        for budget, held in pts.groupby("budget"):
            rest = pts[pts["budget"] != budget]
            if rest["budget"].nunique() < 2:  # one budget cannot fix a law over compute
                continue
            form = fit_form(name, rest)
            if form is None:
                continue
            errs += list(_errors_at([form], held))
            scored += 1
        out[name] = float(np.sqrt(np.mean(np.square(errs)))) if scored >= 2 else math.inf
    return out


@dataclass
class Backtest:
    """The kept forms fitted to the budgets below ``budget`` (as a forecast is made), their
    mean's signed relative errors on that budget's best points (positive: they ran high)."""
    budget: float
    decades: float  # from the highest budget fitted to ``budget``
    errors: np.ndarray

    @property
    def rates(self) -> np.ndarray:  # per decade of compute
        return self.errors / self.decades


def forward_backtests(means: pd.DataFrame, convention: str, forms: list[str]) -> list[Backtest]:
    """One forward backtest per budget from the third on."""
    pts = convention_points(means, convention)
    budgets = sorted(pts["budget"].unique())
    out = []
    for k in range(2, len(budgets)):
        below = pts[pts["budget"] < budgets[k]]
        fitted = [f for f in (fit_form(name, below) for name in forms) if f is not None]
        if fitted:
            out.append(Backtest(float(budgets[k]), math.log10(budgets[k] / budgets[k - 1]),
                                _errors_at(fitted, pts[pts["budget"] == budgets[k]])))
    return out


def extrapolation_error(backtests: list[Backtest]) -> float:
    """The forecast's error per decade of extrapolation: the rms of the backtests' rates over
    their points; 0 when too few budgets allow a backtest."""
    return float(np.sqrt(np.mean(np.square(np.concatenate([b.rates for b in backtests]))))) \
        if backtests else 0.0


def backtest_note(backtests: list[Backtest], run_sd: float) -> str | None:
    """One line on the backtests' signs. Where every one ran high (or low) by more than one
    run's seed noise, a forecast from the same forms most likely does too: on the CPU studies of
    docs/scaling-study.md every backtest ran high, and so did every 10x forecast."""
    if len(backtests) < 2:
        return None
    errs = [float(np.mean(b.errors)) for b in backtests]
    listed = ", ".join(f"{float(np.mean(b.rates)):+.1%}" for b in backtests)
    head = f"forward backtests (kept forms fitted below a budget, scored on it): {listed} per decade"
    for sign, way in ((1, "high"), (-1, "low")):
        if all(sign * e > run_sd for e in errs):
            return (f"{head}, each too {way} by more than one run's seed noise: this forecast "
                    f"most likely runs {way} too (its interval counts this error; its point "
                    "is not corrected)")
    return f"{head}: no direction of error beyond the seed noise"


def kept_forms(cv: dict[str, float]) -> list[str]:
    best = min(cv.values())
    if not math.isfinite(best):
        return []
    ratio, floor = FORM_TOLERANCE
    return [k for k, v in cv.items() if v <= max(ratio * best, best + floor)]


def _resample(means: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """The point means with each point's seeds drawn with replacement (with one seed per point,
    the points of each budget drawn with replacement instead)."""
    out = means.copy()
    if means["losses"].apply(len).max() > 1:
        out["loss"] = [float(np.mean(rng.choice(x, len(x)))) for x in means["losses"]]
        return out
    idx = np.concatenate([rng.choice(g.index.to_numpy(), len(g))
                          for _, g in means.groupby("budget")])
    return out.loc[idx].reset_index(drop=True)


def make_forecast(runs: pd.DataFrame, multiples: list[float], shape_of: Callable[[float], Shape],
                  n_convention: str = "matmul", n_boot: int = 200, seed: int = 0,
                  ci: float = 0.95) -> Forecast:
    """Forecast the runs at ``multiples`` x the largest budget (see the module docstring).
    ``runs``: the study's finished main runs (runs.csv). ``shape_of``: the family's shape
    nearest a target N (sweep's convention). Raises ValueError when no form can be fitted."""
    means = point_means(runs)
    maps = _Maps.fit(means, n_convention)
    cv = cross_validate(means, n_convention)
    kept = kept_forms(cv)
    notes = [f"forms kept by cross-validation: {', '.join(kept)}"] if kept else []
    if not kept:  # too few interior minima to score a form on a budget it did not see
        kept = [f for f in FORMS if fit_form(f, convention_points(means, n_convention)) is not None]
        notes = [f"no form could be cross-validated (that needs >= 3 budgets with an interior "
                 f"IsoFLOP minimum): the forecast spans every form that fits ({', '.join(kept)}) "
                 "and is not validated"]
    if not kept:
        raise ValueError("forecast: no form fits these runs (too few points or budgets); add "
                         "budgets or sizes, or set sweep.forecast_multiples=[]")
    fits = {(f, c): fit_form(f, convention_points(means, c)) for f in kept for c in CONVENTIONS}
    fits = {k: v for k, v in fits.items() if v is not None}
    rng = np.random.default_rng(seed)
    boots: dict[tuple[str, str], list[Any]] = {k: [] for k in fits}
    for _ in range(n_boot):
        sample = _resample(means, rng)
        for (f, c), full in fits.items():
            got = fit_form(f, convention_points(sample, c), start=full)
            if got is not None:
                boots[(f, c)].append(got)
    widen = max((cv[f] for f in kept if math.isfinite(cv[f])), default=0.0)
    backtests = forward_backtests(means, n_convention, kept)
    per_decade = extrapolation_error(backtests)
    run_sd = run_noise(means)
    note = backtest_note(backtests, run_sd)
    notes += [note] if note else []
    top = float(means["budget"].max())
    targets = [_target(m, m * top, fits, boots, kept, maps, shape_of, n_convention,
                       max(widen, per_decade * math.log10(m)), run_sd, ci) for m in multiples]
    return Forecast(targets, cv, kept, run_sd, n_convention, notes, per_decade)


def _target(multiple: float, budget: float, fits: dict, boots: dict, kept: list[str],
            maps: _Maps, shape_of: Callable[[float], Shape], primary: str, widen: float,
            run_sd: float, ci: float) -> Target:
    q = (1 - ci) / 2
    primary_fits = [(f, fits[(f, primary)]) for f in kept if (f, primary) in fits]
    log_n = {f: maps.optimum(form, primary, budget, multiple) for f, form in primary_fits}
    n_star = float(np.exp(np.mean(list(log_n.values()))))
    all_n = [maps.optimum(b, c, budget, multiple) for (f, c), bs in boots.items() for b in bs]
    all_n += list(log_n.values())
    shapes = _role_shapes(n_star, shape_of)
    runs = []
    for role, shape in shapes.items():
        by_form = {f: shape_loss(form, primary, shape, budget) for f, form in primary_fits}
        pred = float(np.mean(list(by_form.values())))
        lows, highs = [], []
        for (_f, c), bs in boots.items():
            vals = [shape_loss(b, c, shape, budget) for b in bs] or \
                   [shape_loss(fits[(_f, c)], c, shape, budget)]
            lows.append(np.quantile(vals, q))
            highs.append(np.quantile(vals, 1 - q))
        extra = (widen**2 + run_sd**2) * pred**2
        lo = pred - math.sqrt(max(pred - min(lows), 0.0) ** 2 + extra)
        hi = pred + math.sqrt(max(max(highs) - pred, 0.0) ** 2 + extra)
        runs.append(ForecastRun(role, shape, budget / shape["flops_per_token"], pred, lo, hi,
                                by_form))
    opt = shapes["optimum"]
    return Target(multiple, budget, float(opt[N_COLUMNS[primary]]),
                  float(np.exp(np.quantile(all_n, q))), float(np.exp(np.quantile(all_n, 1 - q))),
                  budget / opt["flops_per_token"], runs)


def _role_shapes(n_star: float, shape_of: Callable[[float], Shape]) -> dict[str, Shape]:
    """The family's shapes for N*, 2 N* and N*/2 (a neighbour that maps onto N*'s shape is moved
    one factor of 2 further, so three distinct runs are trained)."""
    out = {role: shape_of(n_star * r) for role, r in ROLES.items()}
    for role, r in (("larger", 2.0), ("smaller", 0.5)):
        k = 2
        while out[role] == out["optimum"] and k <= 4:
            out[role] = shape_of(n_star * r**k)
            k += 1
    return out


def exponent_by_convention(runs: pd.DataFrame, n_boot: int = 200, seed: int = 0,
                           ci: float = 0.95) -> pd.DataFrame:
    """Approach 2's a (N* ∝ C^a through the IsoFLOP minima) in each counting convention, with a
    bootstrap interval over the seeds; the last row spans all four (value: their mean)."""
    means = point_means(runs)
    rng = np.random.default_rng(seed)
    samples = [_resample(means, rng) for _ in range(n_boot)]
    q = (1 - ci) / 2
    rows = []
    for conv in CONVENTIONS:
        a = _slope(convention_points(means, conv))
        boot = [x for s in samples if math.isfinite(x := _slope(convention_points(s, conv)))]
        lo, hi = (np.quantile(boot, [q, 1 - q]) if boot else (math.nan, math.nan))
        rows.append({"convention": conv, "a": a, "a_lo": float(lo), "a_hi": float(hi)})
    table = pd.DataFrame(rows)
    span = {"convention": "all four", "a": float(table["a"].mean()),
            "a_lo": float(table["a_lo"].min()), "a_hi": float(table["a_hi"].max())}
    return pd.concat([table, pd.DataFrame([span])], ignore_index=True)


def _slope(pts: pd.DataFrame) -> float:
    m = budget_minima(pts)
    if len(m) < 2:
        return math.nan
    return float(np.polyfit(np.log(m["c"]), np.log(m["n"]), 1)[0])
