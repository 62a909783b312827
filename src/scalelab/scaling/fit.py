"""Fit Chinchilla's three approaches to a table of runs, with bootstrap CIs, an
extrapolation check and a per-variant comparison.

Entry point::

    from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
    results = fit_scaling_laws(runs_df, curves=curves_df, options=FitOptions(n_boot=200))
    results.variants["default"].estimates["approach3.alpha"]   # Estimate(value, lo, hi, n)
    write_report(results, "reports/sweep1")

The pieces live in fit_data (input), fit_isoflop (approaches 1 and 2), fit_parametric
(approach 3) and fit_synthetic (known-law test data).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .fit_data import FitInputError, FitOptions, prepare_curves, prepare_runs
from .fit_isoflop import EnvelopeFit, IsoFlopFit, fit_envelope, fit_isoflop
from .fit_parametric import FlopsPerToken, ParametricFit, fit_parametric, init_grid, theta_of


@dataclass
class Estimate:
    """A fitted quantity with its bootstrap percentile interval (nan when n_boot = 0)."""

    value: float
    lo: float = float("nan")
    hi: float = float("nan")
    n: int = 0  # successful bootstrap replicates

    def fmt(self, digits: int = 3) -> str:
        if math.isnan(self.value):
            return "—"
        v = f"{self.value:.{digits}g}"
        if math.isnan(self.lo):
            return v
        return f"{v} [{self.lo:.{digits}g}, {self.hi:.{digits}g}]"


@dataclass
class ExtrapolationCheck:
    """Fit without the largest budget and predict that budget's compute-optimal loss."""

    held_out_budget: float
    n_train_points: int
    predicted_loss: float  # Approach 3 (fitted without the budget) at its optimal (N, D)
    actual_loss: float  # the held-out budget's parabola minimum, else its lowest loss
    actual_source: str
    rel_error: float  # (predicted - actual) / actual
    predicted_n_opt: float = float("nan")  # Approach 2 power law without the budget
    actual_n_opt: float = float("nan")  # the held-out budget's parabola vertex


@dataclass
class VariantFit:
    """All fits for one variant (one architecture option of a sweep)."""

    variant: str
    runs: pd.DataFrame
    curves: pd.DataFrame | None
    flops_per_token: FlopsPerToken
    approach1: EnvelopeFit | None = None
    approach2: IsoFlopFit | None = None
    approach3: ParametricFit | None = None
    estimates: dict[str, Estimate] = field(default_factory=dict)
    boot: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per replicate
    extrapolation: ExtrapolationCheck | None = None
    skipped: dict[int, str] = field(default_factory=dict)  # approach -> why it was not run


@dataclass
class ScalingResults:
    """What :func:`fit_scaling_laws` returns and :func:`write_report` consumes."""

    variants: dict[str, VariantFit]
    options: FitOptions
    reference_compute: float
    notes: list[str] = field(default_factory=list)
    comparison: pd.DataFrame | None = None  # variants vs the first one (>= 2 variants)


def _quantities(fit1, fit2, fit3, c_ref: float, fpt: FlopsPerToken) -> dict[str, float]:
    """The scalar quantities that get bootstrap intervals (nan where a fit is degenerate)."""
    with np.errstate(all="ignore"):
        return _quantities_raw(fit1, fit2, fit3, c_ref, fpt)


def _quantities_raw(fit1, fit2, fit3, c_ref: float, fpt: FlopsPerToken) -> dict[str, float]:
    q: dict[str, float] = {}
    for name, f in (("approach1", fit1), ("approach2", fit2)):
        if f is not None:
            q[f"{name}.a"], q[f"{name}.b"] = f.a, f.b
            q[f"{name}.tokens_per_param"] = float(f.d_opt(c_ref) / f.n_opt(c_ref))
            # Coefficients too, so the report can draw bootstrap bands around the lines.
            q[f"{name}.n_coef"], q[f"{name}.d_coef"] = f.n_opt.coefficient, f.d_opt.coefficient
    if fit3 is not None:
        for k, v in fit3.as_dict().items():
            if k != "G":
                q[f"approach3.{k}"] = v
        q["approach3.tokens_per_param"] = float(fit3.tokens_per_param(c_ref))
        q["approach3.optimal_loss"] = float(fit3.optimal_loss(c_ref, fpt))
    return q


def _fit3(runs: pd.DataFrame, opts: FitOptions, **kw) -> ParametricFit:
    if len(runs) < opts.min_points_parametric:
        raise FitInputError(
            f"Approach 3 needs >= {opts.min_points_parametric} runs (5 free parameters), got {len(runs)}"
        )
    kw.setdefault("grid", opts.grid)
    return fit_parametric(runs["N"], runs["D"], runs["loss"], delta=opts.huber_delta, reduction=opts.reduction,
                          tol=opts.tol, init=opts.init, method=opts.method, **kw)


def _bootstrap(vf: VariantFit, opts: FitOptions, c_ref: float, rng: np.random.Generator) -> pd.DataFrame:
    runs, rows = vf.runs, []
    # Approach 3 replicates warm-start from the full-data optimum plus a coarse grid.
    starts = None
    if vf.approach3 is not None:
        starts = theta_of(vf.approach3)[None]
        if opts.boot_grid != "none":
            starts = np.vstack([starts, init_grid(opts.boot_grid)])
    run_ids = runs["run_id"].unique()
    for _ in range(opts.n_boot):
        f1 = f2 = f3 = None
        if vf.approach1 is not None:  # resample whole curves
            pick = rng.choice(run_ids, len(run_ids), replace=True)
            with contextlib.suppress(FitInputError):
                f1 = fit_envelope(vf.curves[vf.curves["run_id"].isin(pick)])
        if vf.approach2 is not None:  # resample runs within each budget
            parts = [g.iloc[rng.integers(0, len(g), len(g))] for _, g in runs.groupby("budget")]
            with contextlib.suppress(FitInputError):
                f2 = fit_isoflop(pd.concat(parts), opts.min_sizes_per_budget)
        if vf.approach3 is not None:  # resample runs
            sample = runs.iloc[rng.integers(0, len(runs), len(runs))]
            f3 = _fit3(sample, opts, starts=starts, polish=1)
        rows.append(_quantities(f1, f2, f3, c_ref, vf.flops_per_token))
    return pd.DataFrame(rows)


def _extrapolate(vf: VariantFit, opts: FitOptions) -> ExtrapolationCheck | None:
    runs = vf.runs
    budgets = np.sort(runs["budget"].unique())
    if len(budgets) < 3:
        return None
    held = float(budgets[-1])
    train = runs[runs["budget"] < held]
    test = runs[runs["budget"] == held]
    if len(train) < opts.min_points_parametric:
        return None
    f3 = _fit3(train, opts)
    predicted = float(f3.optimal_loss(held, vf.flops_per_token))
    actual, source, n_actual = float(test["loss"].min()), "lowest observed loss", float("nan")
    if vf.approach2 is not None:
        row = vf.approach2.budgets[vf.approach2.budgets["budget"] == held]
        if len(row) and not bool(row["flagged"].iloc[0]):
            actual, source = float(row["loss_opt"].iloc[0]), "IsoFLOP parabola minimum"
            n_actual = float(row["N_opt"].iloc[0])
    n_pred = float("nan")
    if vf.approach2 is not None:
        with contextlib.suppress(FitInputError):
            n_pred = float(fit_isoflop(train, opts.min_sizes_per_budget).n_opt(held))
    return ExtrapolationCheck(held_out_budget=held, n_train_points=len(train), predicted_loss=predicted,
                              actual_loss=actual, actual_source=source, rel_error=(predicted - actual) / actual,
                              predicted_n_opt=n_pred, actual_n_opt=n_actual)


def fit_variant(runs: pd.DataFrame, curves: pd.DataFrame | None, opts: FitOptions, c_ref: float,
                rng: np.random.Generator) -> VariantFit:
    """All requested approaches for one variant's canonical runs (and curves) table."""
    vf = VariantFit(variant=str(runs["variant"].iloc[0]), runs=runs, curves=curves,
                    flops_per_token=FlopsPerToken.fit(runs["N"], runs["fpt"]))
    if 3 in opts.approaches and len(runs) < opts.min_points_parametric:  # cheapest check first
        _fit3(runs, opts)
    if 1 in opts.approaches:
        if curves is None or curves.empty:
            vf.skipped[1] = "no loss curves given"
        else:  # curves are optional extras, so an unusable envelope is a note, not an error
            try:
                vf.approach1 = fit_envelope(curves)
            except FitInputError as exc:
                vf.skipped[1] = str(exc)
    if 2 in opts.approaches:
        vf.approach2 = fit_isoflop(runs, opts.min_sizes_per_budget)
    if 3 in opts.approaches:
        vf.approach3 = _fit3(runs, opts)
    point = _quantities(vf.approach1, vf.approach2, vf.approach3, c_ref, vf.flops_per_token)
    if opts.n_boot > 0:
        vf.boot = _bootstrap(vf, opts, c_ref, rng)
    lo_q, hi_q = (1 - opts.ci) / 2, 1 - (1 - opts.ci) / 2
    for k, v in point.items():
        col = vf.boot[k] if k in vf.boot else pd.Series(dtype=float)
        col = col[np.isfinite(col.to_numpy(dtype=float))]
        if len(col) >= 2:
            vf.estimates[k] = Estimate(v, float(col.quantile(lo_q)), float(col.quantile(hi_q)), len(col))
        else:
            vf.estimates[k] = Estimate(v)
    if opts.extrapolate and 3 in opts.approaches:
        vf.extrapolation = _extrapolate(vf, opts)
    return vf


def _compare(variants: dict[str, VariantFit], opts: FitOptions, c_ref: float) -> pd.DataFrame | None:
    """Each variant against the first: exponents and the predicted optimal-loss ratio at c_ref."""
    names = list(variants)
    if len(names) < 2:
        return None
    base = variants[names[0]]
    lo_q, hi_q = (1 - opts.ci) / 2, 1 - (1 - opts.ci) / 2
    rows = []
    for name in names[1:]:
        v = variants[name]
        row: dict[str, object] = {"variant": name, "baseline": base.variant}
        for key in ("approach3.alpha", "approach3.beta", "approach3.a", "approach2.a", "approach2.b"):
            if key in v.estimates and key in base.estimates:
                row[key] = v.estimates[key]
                row[key + " (baseline)"] = base.estimates[key]
        k = "approach3.optimal_loss"
        if k in v.estimates and k in base.estimates:
            ratio = Estimate(v.estimates[k].value / base.estimates[k].value)
            if k in v.boot and k in base.boot:  # replicates are independent: pair by index
                n = min(len(v.boot), len(base.boot))
                r = (v.boot[k].to_numpy()[:n] / base.boot[k].to_numpy()[:n])
                r = r[np.isfinite(r)]
                if len(r) >= 2:
                    ratio = Estimate(ratio.value, float(np.quantile(r, lo_q)), float(np.quantile(r, hi_q)), len(r))
            row["loss_ratio"] = ratio
            row["better"] = name if ratio.value < 1 else base.variant
            row["significant"] = bool(ratio.hi < 1 or ratio.lo > 1) if not math.isnan(ratio.lo) else False
        rows.append(row)
    return pd.DataFrame(rows)


def fit_scaling_laws(runs, curves=None, options: FitOptions | None = None,
                     source: str | None = None) -> ScalingResults:
    """Fit scaling laws to a table of runs.

    Args:
        runs: DataFrame / records, one row per finished run (see :func:`prepare_runs` for the
            columns: N or n_params*, D, loss, optional C/flops*, budget, variant, run_id).
        curves: optional long table of loss curves (run_id, tokens, loss, optional flops),
            needed for Approach 1.
        options: :class:`FitOptions`.
        source: a file name or sweep name, used in error messages.

    Raises FitInputError (a ValueError) naming the column/file for bad or too little data.
    """
    opts = options or FitOptions()
    table = prepare_runs(runs, opts, source)
    notes = list(table.attrs.get("notes", []))
    curve_table = prepare_curves(curves, table, source) if curves is not None and len(curves) else None
    c_ref = float(opts.reference_compute or table["budget"].max())
    rng = np.random.default_rng(opts.seed)
    variants: dict[str, VariantFit] = {}
    for name in pd.unique(table["variant"]):
        sub = table[table["variant"] == name].reset_index(drop=True)
        cur = curve_table[curve_table["variant"] == name] if curve_table is not None else None
        try:
            variants[str(name)] = fit_variant(sub, cur, opts, c_ref, rng)
        except FitInputError as exc:
            prefix = f"variant {name!r}: " if table["variant"].nunique() > 1 else ""
            raise FitInputError(f"{prefix}{exc}" + (f" (data: {source})" if source else "")) from exc
    return ScalingResults(variants=variants, options=opts, reference_compute=c_ref, notes=notes,
                          comparison=_compare(variants, opts, c_ref))
