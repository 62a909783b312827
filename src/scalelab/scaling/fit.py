"""Fit Chinchilla's three approaches to a table of runs, with bootstrap CIs, an
extrapolation check and a per-variant comparison.

Entry point::

    from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
    results = fit_scaling_laws(runs_df, curves=curves_df, options=FitOptions(n_boot=200))
    results.variants["default"].estimates["approach3.alpha"]   # Estimate(value, lo, hi, n)
    write_report(results, "reports/sweep1")

The pieces live in fit_data (input), fit_isoflop (approaches 1 and 2), fit_parametric
(approach 3) and published_laws (reference laws).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import special

from .fit_data import FitInputError, FitOptions, measured_sigma, prepare_curves, prepare_runs
from .fit_holdout import (
    BOOT_KEYS,
    ExtrapolationCheck,
    actual_optimum,
    frontier_fit_check,
    frontier_prediction,
    held_out_budget,
    minima,
    with_intervals,
)
from .fit_isoflop import EnvelopeFit, IsoFlopFit, fit_envelope, fit_isoflop
from .fit_parametric import FlopsPerToken, ParametricFit, fit_parametric, init_grid, theta_of
from .form_check import FormCheck, check_form


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
    form: FormCheck | None = None  # does Approach 3's form describe the points within their noise?
    skipped: dict[int, str] = field(default_factory=dict)  # approach -> why it was not run
    replicates: pd.DataFrame | None = None  # one row per run (seed replicates of a point)
    boot_mode: str = "points"  # "replicates": resample seeds within points; "points": pairs
    used: dict[int, str] = field(default_factory=dict)  # approach -> which points it used


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
        # one FLOPs convention: the allocation uses the data's C = fpt(N) D, not 6ND
        q["approach3.a"], q["approach3.b"] = fit3.a_under(fpt), fit3.b_under(fpt)
        n_ref = float(fit3.n_opt_under(c_ref, fpt))
        q["approach3.tokens_per_param"] = float(c_ref / fpt(n_ref) / n_ref)
        q["approach3.optimal_loss"] = float(fit3.optimal_loss(c_ref, fpt))
    return q


def point_means(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per point (seed replicates share a group_id): the mean loss, its seed spread
    (loss_sd, n_rep), the modelled seed spread (seed_sd, :func:`seed_sd_model`) and the held-out
    standard error (mean over replicates)."""
    if "epochs" not in runs:  # a table from before epochs were recorded
        runs = runs.assign(epochs=np.nan)
    g = runs.groupby("group_id", sort=False)
    out = g.agg(run_id=("run_id", "first"), variant=("variant", "first"), N=("N", "first"),
                D=("D", "mean"), C=("C", "mean"), loss=("loss", "mean"), budget=("budget", "first"),
                fpt=("fpt", "first"), loss_sd=("loss", "std"), n_rep=("loss", "size"),
                loss_se=("loss_se", "mean"), epochs=("epochs", "mean")).reset_index()
    # The standard error of each point's mean: its seeds' spread over sqrt(n) and the held-out
    # set's own error. Measured only where every point has >= 2 seeds; otherwise nan (unweighted).
    out["seed_sd"], out["loss_sigma"] = np.nan, np.nan
    if int(out["n_rep"].min()) >= 2:
        out["seed_sd"] = seed_sd_model(out)
        se = out["loss_se"].fillna(0.0)
        out["loss_sigma"] = np.sqrt(out["seed_sd"] ** 2 / out["n_rep"] + se**2)
    return out[["run_id", "variant", "N", "D", "C", "loss", "budget", "fpt", "group_id", "loss_sd",
                "n_rep", "seed_sd", "loss_se", "loss_sigma", "epochs"]]


def seed_sd_model(points: pd.DataFrame) -> np.ndarray:
    """Each point's seed standard deviation from a smooth model, log sd = c0 + c1 log N +
    c2 log D, fitted to every point's sample sd (pooled: c0 alone with < 6 points).

    Why not each point's own sd: from 3 seeds it has 2 degrees of freedom, so it is often a
    fraction of the true spread, and a point that looks quiet by chance gets a large weight. On
    synthetic 3-seed studies the per-point weights gave Approach 2 intervals covering the true
    exponent 68 % of the time instead of 95 % (tests/scaling/test_seed_noise.py). A sample sd's
    log is biased low by (digamma(k/2) - log(k/2)) / 2 with k = n - 1 degrees of freedom
    (-0.29 for 3 seeds); the fit adds that back."""
    sd = points["loss_sd"].to_numpy(float)
    dof = points["n_rep"].to_numpy(float) - 1
    ok = np.isfinite(sd) & (sd > 0)
    if not ok.any():
        return np.full(len(points), np.nan)
    y = np.log(sd[ok]) - (special.digamma(dof[ok] / 2) - np.log(dof[ok] / 2)) / 2
    x = np.column_stack([np.ones(len(points)), np.log(points["N"]), np.log(points["D"])])
    if ok.sum() < 6:
        x = x[:, :1]
    coef, *_ = np.linalg.lstsq(x[ok], y, rcond=None)
    return np.exp(x @ coef)


def noise_weights(points: pd.DataFrame) -> np.ndarray | None:
    """Weights of the log-loss residuals of Approach 3: the inverse of each point's relative
    standard error, scaled to median 1 so that the Huber delta keeps its meaning (a residual
    of a median-noise point counts as before). None when the noise was not measured."""
    sigma = measured_sigma(points)
    if sigma is None:
        return None
    rel = sigma / points["loss"].to_numpy(dtype=float)
    return np.median(rel) / rel


def endpoint_curves(points: pd.DataFrame) -> pd.DataFrame:
    """Approach 1's loss-vs-D points, from end points only: for every size N trained to >= 2
    different D (separate runs, WSD cooldown branches, or the same shape at several budgets),
    its final losses as a 'curve'. Intermediate evaluations of a cosine run never enter: they
    overstate the loss at early D (the schedule has not decayed there)."""
    rows = []
    for n, g in points.groupby("N"):
        if g["D"].nunique() < 2:
            continue
        for r in g.itertuples():
            rows.append({"run_id": f"N={n:.6g}", "variant": r.variant, "N": float(n),
                         "tokens": float(r.D), "flops": float(r.C), "loss": float(r.loss)})
    return pd.DataFrame(rows, columns=["run_id", "variant", "N", "tokens", "flops", "loss"])


def _resample_replicates(reps: pd.DataFrame, points: pd.DataFrame,
                         rng: np.random.Generator) -> pd.DataFrame:
    """The points with each mean loss rebuilt from the seed replicates' residuals: the noise
    of a fixed design, measured rather than assumed.

    Each replicate's residual from its point's mean, over the point's modelled seed sd
    (:func:`seed_sd_model`) and scaled by sqrt(n/(n-1)) (a mean's residuals have (n-1)/n of
    the variance), joins one pool; each point's resampled mean is its mean plus its seed sd
    times the mean of n draws from the pool. Resampling a point's own 3 seeds instead gives
    only 10 distinct means and intervals too narrow (tests/scaling/test_seed_noise.py)."""
    index = {g: i for i, g in enumerate(points["group_id"])}
    rows = reps["group_id"].map(index).to_numpy()
    sd = np.nan_to_num(points["seed_sd"].to_numpy(float))  # no spread measured: the mean stays
    n = points["n_rep"].to_numpy(float)
    mean = points["loss"].to_numpy(float)
    dev = (reps["loss"].to_numpy(float) - mean[rows]) * np.sqrt(n / (n - 1))[rows]
    resid = np.divide(dev, sd[rows], out=np.zeros_like(dev), where=sd[rows] > 0)
    draws = rng.choice(resid, size=(len(points), int(n.max())), replace=True)
    take = np.arange(draws.shape[1])[None, :] < n[:, None]  # n_rep draws per point
    return points.assign(loss=mean + sd * (draws * take).sum(axis=1) / n)


def _fit3(runs: pd.DataFrame, opts: FitOptions, **kw) -> ParametricFit:
    if len(runs) < opts.min_points_parametric:
        raise FitInputError(
            f"Approach 3 needs >= {opts.min_points_parametric} runs (5 free parameters), got {len(runs)}"
        )
    kw.setdefault("grid", opts.grid)
    weights = noise_weights(runs) if opts.noise_weighted else None
    return fit_parametric(runs["N"], runs["D"], runs["loss"], delta=opts.huber_delta, reduction=opts.reduction,
                          tol=opts.tol, init=opts.init, method=opts.method, weights=weights, **kw)


def _warm_starts(theta: np.ndarray, opts: FitOptions) -> np.ndarray:
    """Approach 3's starts in a bootstrap replicate: the full data's optimum plus a coarse grid."""
    starts = np.atleast_2d(theta)
    return np.vstack([starts, init_grid(opts.boot_grid)]) if opts.boot_grid != "none" else starts


def _bootstrap(vf: VariantFit, opts: FitOptions, c_ref: float, rng: np.random.Generator,
               holdout_start: np.ndarray | None = None) -> pd.DataFrame:
    """One row of quantities per replicate; with a hold-out check, also its two errors refitted
    on the replicate (``holdout_start``: the hold-out fit's warm starts)."""
    runs, rows = vf.runs, []
    starts = None if vf.approach3 is None else _warm_starts(theta_of(vf.approach3), opts)
    curves = endpoint_curves(runs)
    curve_ids = curves["run_id"].unique()
    for _ in range(opts.n_boot):
        f1 = f2 = f3 = None
        if vf.boot_mode == "replicates":
            # fixed design: the same points, each mean from a resample of its own seeds
            sample = _resample_replicates(vf.replicates, runs, rng)
            with contextlib.suppress(FitInputError):
                if vf.approach1 is not None:
                    f1 = fit_envelope(endpoint_curves(sample))
            with contextlib.suppress(FitInputError):
                if vf.approach2 is not None:
                    f2 = fit_isoflop(sample, opts.min_sizes_per_budget, opts.noise_weighted)
            if vf.approach3 is not None:
                f3 = _fit3(sample, opts, starts=starts, polish=1)
            rows.append(_quantities(f1, f2, f3, c_ref, vf.flops_per_token)
                        | _holdout_errors(sample, f2, vf, opts, holdout_start) | minima(f2))
            continue
        if vf.approach1 is not None:  # resample whole end-point curves (one per size)
            pick = rng.choice(curve_ids, len(curve_ids), replace=True)
            with contextlib.suppress(FitInputError):
                f1 = fit_envelope(pd.concat([curves[curves["run_id"] == i] for i in pick]))
        # resample runs within each budget (Approach 2 and the hold-out check)
        by_budget = pd.concat([g.iloc[rng.integers(0, len(g), len(g))] for _, g in runs.groupby("budget")])
        if vf.approach2 is not None:
            with contextlib.suppress(FitInputError):
                f2 = fit_isoflop(by_budget, opts.min_sizes_per_budget)
        if vf.approach3 is not None:  # resample runs
            sample = runs.iloc[rng.integers(0, len(runs), len(runs))]
            f3 = _fit3(sample, opts, starts=starts, polish=1)
        rows.append(_quantities(f1, f2, f3, c_ref, vf.flops_per_token)
                    | _holdout_errors(by_budget, f2, vf, opts, holdout_start) | minima(f2))
    return pd.DataFrame(rows)


def _holdout(sample: pd.DataFrame, held: float, iso_all: IsoFlopFit | None, fpt: FlopsPerToken,
             opts: FitOptions, **fit_kw) -> tuple[ExtrapolationCheck, ParametricFit]:
    """The hold-out check on ``sample`` (the points, or one bootstrap replicate of them), and
    Approach 3 fitted below ``held`` (a warm start for the replicates). ``iso_all``: Approach 2
    on all of ``sample``, for the held-out budget's actual minimum."""
    train, test = sample[sample["budget"] < held], sample[sample["budget"] == held]
    f3 = _fit3(train, opts, **fit_kw)
    predicted = float(f3.optimal_loss(held, fpt))
    actual, source, n_actual = actual_optimum(test, iso_all, held)
    n_pred, frontier, gamma = float("nan"), float("nan"), float("nan")
    if iso_all is not None:
        with contextlib.suppress(FitInputError):
            iso = fit_isoflop(train, opts.min_sizes_per_budget, opts.noise_weighted)
            n_pred = float(iso.n_opt(held))
            frontier, gamma = frontier_prediction(iso.budgets, held)
    check = ExtrapolationCheck(held_out_budget=held, n_train_points=len(train), predicted_loss=predicted,
                               actual_loss=actual, actual_source=source,
                               rel_error=(predicted - actual) / actual, predicted_n_opt=n_pred,
                               actual_n_opt=n_actual, frontier_loss=frontier, frontier_gamma=gamma)
    return check, f3


def _holdout_errors(sample: pd.DataFrame, iso_all: IsoFlopFit | None, vf: VariantFit,
                    opts: FitOptions, start: np.ndarray | None) -> dict[str, float]:
    """The two hold-out errors of one bootstrap replicate (nan where a fit fails)."""
    if vf.extrapolation is None:
        return {}
    try:
        kw = {} if start is None else {"starts": start, "polish": 1}
        check, _ = _holdout(sample, vf.extrapolation.held_out_budget, iso_all, vf.flops_per_token,
                            opts, **kw)
    except (FitInputError, ValueError, np.linalg.LinAlgError):
        return dict.fromkeys(BOOT_KEYS, float("nan"))
    return dict(zip(BOOT_KEYS, (check.rel_error, check.frontier_error), strict=True))


def fit_variant(runs: pd.DataFrame, curves: pd.DataFrame | None, opts: FitOptions, c_ref: float,
                rng: np.random.Generator) -> VariantFit:
    """All requested approaches for one variant's canonical runs (and curves) table."""
    reps = runs
    runs = point_means(reps)
    vf = VariantFit(variant=str(runs["variant"].iloc[0]), runs=runs, curves=curves,
                    flops_per_token=FlopsPerToken.fit(runs["N"], runs["fpt"]), replicates=reps,
                    # a point with one seed has no measured noise: resampling seeds would
                    # treat it as exact, so the replicate bootstrap needs >= 2 seeds everywhere
                    boot_mode="replicates" if int(runs["n_rep"].min()) >= 2 else "points")
    if 3 in opts.approaches and len(runs) < opts.min_points_parametric:  # cheapest check first
        _fit3(runs, opts)
    if 1 in opts.approaches:
        ends = endpoint_curves(runs)
        try:
            vf.approach1 = fit_envelope(ends)
            vf.used[1] = (f"end points of {ends['run_id'].nunique()} sizes trained to >= 2 token "
                          f"counts ({len(ends)} runs); no intermediate evaluations")
        except FitInputError as exc:
            vf.skipped[1] = (f"{exc} (from end points only: {ends['run_id'].nunique()} sizes "
                             "have runs at >= 2 token counts; use sweep.wsd=true or sweep.mode="
                             "grid for real end points)")
    if 2 in opts.approaches:
        vf.approach2 = fit_isoflop(runs, opts.min_sizes_per_budget, opts.noise_weighted)
        vf.used[2] = (f"final losses of {len(runs)} points on {runs['budget'].nunique()} IsoFLOP "
                      "budgets" + (", each the mean of its seeds" if vf.boot_mode == "replicates"
                                   else ""))
    if 3 in opts.approaches:
        vf.approach3 = _fit3(runs, opts)
        vf.used[3] = f"final losses of all {len(runs)} points (N, D, loss)"
        vf.form = check_form(vf.approach3, runs)
    point = _quantities(vf.approach1, vf.approach2, vf.approach3, c_ref, vf.flops_per_token)
    holdout_start = None
    held = held_out_budget(runs)
    if opts.extrapolate and 3 in opts.approaches and held is not None \
            and (runs["budget"] < held).sum() >= opts.min_points_parametric:
        vf.extrapolation, f3_train = _holdout(runs, held, vf.approach2, vf.flops_per_token, opts)
        holdout_start = _warm_starts(theta_of(f3_train), opts)
    if opts.n_boot > 0:
        vf.boot = _bootstrap(vf, opts, c_ref, rng, holdout_start)
        if vf.extrapolation is not None:
            vf.extrapolation = with_intervals(vf.extrapolation, vf.boot, opts.ci)
            if vf.approach2 is not None:
                ex = vf.extrapolation
                ex.frontier_chi2, ex.frontier_dof = frontier_fit_check(vf.approach2.budgets, vf.boot)
    lo_q, hi_q = (1 - opts.ci) / 2, 1 - (1 - opts.ci) / 2
    for k, v in point.items():
        col = vf.boot[k] if k in vf.boot else pd.Series(dtype=float)
        col = col[np.isfinite(col.to_numpy(dtype=float))]
        if len(col) >= 2:
            vf.estimates[k] = Estimate(v, float(col.quantile(lo_q)), float(col.quantile(hi_q)), len(col))
        else:
            vf.estimates[k] = Estimate(v)
    return vf


def _law(row: dict) -> ParametricFit:
    return ParametricFit(E=row["E"], A=row["A"], B=row["B"], alpha=row["alpha"], beta=row["beta"],
                         objective=float("nan"), n_points=0, n_starts=0, converged_starts=0,
                         seconds=0.0)


def optimal_loss_at(fit: ParametricFit, c, fpt: FlopsPerToken) -> np.ndarray:
    """Compute-optimal loss at C under the data's FLOPs convention (closed form)."""
    with np.errstate(all="ignore"):
        return fit.predict(fit.n_opt_under(c, fpt), fit.d_opt_under(c, fpt))


def compute_multiplier(variant: ParametricFit, fpt_v: FlopsPerToken, baseline: ParametricFit,
                       fpt_b: FlopsPerToken, c_ref: float) -> float:
    """C' / c_ref where the baseline's compute-optimal loss at C' equals the variant's at c_ref:
    how much more compute the baseline needs for the variant's loss (> 1: the variant is
    better; < 1: it is worse). inf when the baseline never reaches it (below its E)."""
    from scipy.optimize import brentq

    target = float(optimal_loss_at(variant, c_ref, fpt_v))

    def gap(log_c: float) -> float:
        return float(optimal_loss_at(baseline, np.exp(log_c), fpt_b)) - target

    x0 = math.log(c_ref)
    lo, hi = x0 - 40.0, x0 + 40.0
    try:
        g_lo, g_hi = gap(lo), gap(hi)
    except (OverflowError, ValueError):  # pragma: no cover - degenerate law
        return float("nan")
    if not (np.isfinite(g_lo) and np.isfinite(g_hi) and np.isfinite(target)):
        return float("nan")
    if g_hi > 0:  # even 1e17 x more compute does not reach it
        return float("inf")
    if g_lo < 0:
        return 0.0
    return float(np.exp(brentq(gap, lo, hi, xtol=1e-10) - x0))


def _multiplier_estimate(v: VariantFit, base: VariantFit, c_ref: float, opts: FitOptions) -> Estimate:
    value = compute_multiplier(v.approach3, v.flops_per_token, base.approach3,
                               base.flops_per_token, c_ref)
    keys = [f"approach3.{k}" for k in ("E", "A", "B", "alpha", "beta")]
    if not (all(k in v.boot for k in keys) and all(k in base.boot for k in keys)):
        return Estimate(value)
    n = min(len(v.boot), len(base.boot))  # replicates are independent: pair by index
    out = []
    for i in range(n):
        rv = {k.split(".")[1]: float(v.boot[k].iloc[i]) for k in keys}
        rb = {k.split(".")[1]: float(base.boot[k].iloc[i]) for k in keys}
        if all(np.isfinite(list(rv.values()))) and all(np.isfinite(list(rb.values()))):
            out.append(compute_multiplier(_law(rv), v.flops_per_token, _law(rb),
                                          base.flops_per_token, c_ref))
    m = np.array(out, float)
    m = m[~np.isnan(m)]
    if len(m) < 2:
        return Estimate(value)
    lo_q, hi_q = (1 - opts.ci) / 2, 1 - (1 - opts.ci) / 2
    return Estimate(value, float(np.quantile(m, lo_q)), float(np.quantile(m, hi_q)), len(m))


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
        if v.approach3 is not None and base.approach3 is not None:
            row["compute_multiplier"] = _multiplier_estimate(v, base, c_ref, opts)
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


def fit_available(runs, curves=None, options: FitOptions | None = None,
                  source: str | None = None) -> tuple[ScalingResults | None, list[str]]:
    """Fit every approach the data allow: (results or None, notes naming what was left out
    and why). Each approach is tried alone without bootstrap first; the ones that fit go into
    one final fit with bootstrap intervals and the extrapolation check."""
    import dataclasses

    opts = options or FitOptions()
    notes, ok = [], []
    for a in opts.approaches:
        try:
            trial = fit_scaling_laws(runs, curves, dataclasses.replace(
                opts, approaches=[a], n_boot=0, extrapolate=False), source=source)
        except (FitInputError, ValueError, np.linalg.LinAlgError) as e:
            notes.append(f"Approach {a} left out: {e}")
            continue
        # an approach skipped inside a variant (Approach 1 without curves) fitted nothing
        skipped = [vf.skipped[a] for vf in trial.variants.values() if a in vf.skipped]
        if skipped:
            notes.append(f"Approach {a} left out: {skipped[0]}")
        else:
            ok.append(a)
    if not ok:
        return None, notes
    results = fit_scaling_laws(runs, curves, dataclasses.replace(opts, approaches=ok), source=source)
    results.notes = notes + results.notes
    return results, notes
