"""Approaches 1 and 2: compute-optimal N and D as power laws in C.

Approach 1 (lower envelope): for each FLOP level, the run whose loss curve is lowest there
gives N_opt and D_opt. Approach 2 (IsoFLOP profiles): per budget, a parabola in log N fitted
to the final losses; its vertex gives N_opt. Both then fit N_opt ∝ C^a and D_opt ∝ C^b by
least squares in log-log space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .fit_data import FitInputError, measured_sigma


@dataclass
class PowerLaw:
    """y = coefficient * C^exponent, fitted by least squares on log y vs log C."""

    exponent: float
    coefficient: float

    def __call__(self, c) -> np.ndarray:
        return self.coefficient * np.asarray(c, float) ** self.exponent

    @classmethod
    def fit(cls, c, y, log_sd=None) -> PowerLaw:
        """``log_sd``: standard errors of log y; given, each point weighs 1 / log_sd."""
        c, y = np.asarray(c, float), np.asarray(y, float)
        if len(c) < 2 or np.ptp(np.log(c)) == 0:
            raise FitInputError(f"a power-law fit needs >= 2 distinct C values, got {len(np.unique(c))}")
        w = None if log_sd is None else 1.0 / np.asarray(log_sd, float)
        slope, icpt = np.polyfit(np.log(c), np.log(y), 1, w=w)
        return cls(exponent=float(slope), coefficient=float(np.exp(icpt)))


class _OptimumExponents:
    """``a`` and ``b`` of N_opt ∝ C^a and D_opt ∝ C^b, for results holding both power laws."""

    n_opt: PowerLaw
    d_opt: PowerLaw

    @property
    def a(self) -> float:
        return self.n_opt.exponent

    @property
    def b(self) -> float:
        return self.d_opt.exponent


@dataclass
class EnvelopeFit(_OptimumExponents):
    """Approach 1 result. ``points``: C, N_opt, D_opt, loss, run_id per FLOP level."""

    points: pd.DataFrame
    n_opt: PowerLaw
    d_opt: PowerLaw


def fit_envelope(curves: pd.DataFrame, n_levels: int = 60, min_runs: int = 2,
                 drop_edges: bool = True) -> EnvelopeFit:
    """Approach 1 on a canonical curves table (run_id, N, tokens, flops, loss).

    FLOP levels are log-spaced over the range where at least ``min_runs`` curves have data;
    each curve is interpolated linearly in log FLOPs (never extrapolated). With
    ``drop_edges``, levels won by the smallest or largest model are dropped (censored).
    """
    if curves is None or len(curves) == 0:
        raise FitInputError("Approach 1 needs loss curves (run_id, tokens, flops, loss); none given")
    groups = [g.sort_values("flops") for _, g in curves.groupby("run_id")]
    groups = [g for g in groups if len(g) >= 2]
    if len(groups) < 2 or len({float(g["N"].iloc[0]) for g in groups}) < 2:
        raise FitInputError("Approach 1 needs loss curves of >= 2 runs with different N (>= 2 points each)")
    lo = np.array([np.log(g["flops"].iloc[0]) for g in groups])
    hi = np.array([np.log(g["flops"].iloc[-1]) for g in groups])
    levels = np.linspace(lo.min(), hi.max(), n_levels)
    rows = []
    for x in levels:
        cover = [(i, g) for i, g in enumerate(groups) if lo[i] <= x <= hi[i]]
        if len(cover) < min_runs:
            continue
        losses = [np.interp(x, np.log(g["flops"].to_numpy()), g["loss"].to_numpy()) for _, g in cover]
        k = int(np.argmin(losses))
        g = cover[k][1]
        tokens = float(np.exp(np.interp(x, np.log(g["flops"].to_numpy()), np.log(g["tokens"].to_numpy()))))
        rows.append({"C": float(np.exp(x)), "N_opt": float(g["N"].iloc[0]), "D_opt": tokens,
                     "loss": float(losses[k]), "run_id": g["run_id"].iloc[0]})
    pts = pd.DataFrame(rows)
    if len(pts) and drop_edges:
        # Where the smallest (largest) model wins, the true optimum may be smaller (larger):
        # the envelope is censored there, so those FLOP levels are dropped.
        sizes = [float(g["N"].iloc[0]) for g in groups]
        pts = pts[(pts["N_opt"] > min(sizes)) & (pts["N_opt"] < max(sizes))].reset_index(drop=True)
    if len(pts) < 2 or pts["N_opt"].nunique() < 2:
        raise FitInputError("Approach 1: the lower envelope has < 2 distinct model sizes; add curves or sizes")
    return EnvelopeFit(points=pts, n_opt=PowerLaw.fit(pts["C"], pts["N_opt"]),
                       d_opt=PowerLaw.fit(pts["C"], pts["D_opt"]))


@dataclass
class PowerLawCheck:
    """Does N_opt follow one power law in C? A test of Approach 2's own model.

    ``chi2`` of the weighted power law through the budgets' vertices (each weighed by its
    measured standard error), with ``dof`` = budgets - 2 and its ``p_value``; ``curvature`` is the
    quadratic term of log N_opt in log C (0 for a power law) with its standard error; ``local``
    has the exponent between each pair of neighbouring budgets (c_lo, c_hi, a, a_se). Approach 2's
    bootstrap interval covers the noise of the vertices given a power law; when the vertices bend,
    a depends on which budgets are in the study, and Approach 3, whose form implies a single
    exponent, averages the bend differently.
    """

    chi2: float
    dof: int
    p_value: float
    curvature: float
    curvature_se: float
    local: pd.DataFrame

    @property
    def misfit(self) -> bool:
        """The power law is rejected at the 5 % level."""
        return self.p_value < 0.05

    @property
    def scale(self) -> float:
        """sqrt(chi2 / dof) (Birge ratio, >= 1): how much wider a's interval gets when the scatter
        about the power law is taken as the vertices' real error."""
        return max(1.0, math.sqrt(self.chi2 / self.dof))

    def summary(self) -> str:
        a = self.local["a"]
        bend = (f"local a from {a.iloc[0]:.2f} (C {self.local['c_lo'].iloc[0]:.3g}-"
                f"{self.local['c_hi'].iloc[0]:.3g}) to {a.iloc[-1]:.2f} (C "
                f"{self.local['c_lo'].iloc[-1]:.3g}-{self.local['c_hi'].iloc[-1]:.3g})")
        verdict = "rejected" if self.misfit else "consistent"
        return (f"N_opt ∝ C^a {verdict}: chi2 {self.chi2:.1f} on {self.dof} dof (p = "
                f"{self.p_value:.2g}), curvature {self.curvature:+.3f} ± {self.curvature_se:.3f} "
                f"per (ln C)^2, {bend}")


def check_power_law(budgets: pd.DataFrame) -> PowerLawCheck | None:
    """:class:`PowerLawCheck` of the usable budgets of an :class:`IsoFlopFit` table; None
    without >= 3 usable budgets with measured vertex errors (``log_n_sd``: needs >= 2 seeds)."""
    ok = budgets[~budgets["flagged"]].sort_values("budget")
    sd = ok["log_n_sd"].to_numpy(float)
    if len(ok) < 3 or not np.all(np.isfinite(sd) & (sd > 0)):
        return None
    x, y = np.log(ok["budget"].to_numpy(float)), np.log(ok["N_opt"].to_numpy(float))
    line = np.polyfit(x, y, 1, w=1 / sd)
    chi2 = float(np.sum(((y - np.polyval(line, x)) / sd) ** 2))
    dof = len(ok) - 2
    curve, cov = np.polyfit(x, y, 2, w=1 / sd, cov="unscaled")
    dx = np.diff(x)
    local = pd.DataFrame({"c_lo": ok["budget"].to_numpy()[:-1], "c_hi": ok["budget"].to_numpy()[1:],
                          "a": np.diff(y) / dx, "a_se": np.hypot(sd[:-1], sd[1:]) / dx})
    return PowerLawCheck(chi2=chi2, dof=dof, p_value=float(stats.chi2.sf(chi2, dof)),
                         curvature=float(curve[0]), curvature_se=float(np.sqrt(cov[0, 0])),
                         local=local)


@dataclass
class IsoFlopFit(_OptimumExponents):
    """Approach 2 result.

    ``budgets``: one row per budget: budget, n_sizes, coef (c2, c1, c0 of loss = c2 x^2 +
    c1 x + c0 with x = log N), N_opt, D_opt, loss_opt, flagged (bool) and reason.
    Power laws are fitted on the unflagged budgets only.
    """

    budgets: pd.DataFrame
    n_opt: PowerLaw
    d_opt: PowerLaw

    @property
    def usable(self) -> pd.DataFrame:
        return self.budgets[~self.budgets["flagged"]]

    @property
    def power_law_check(self) -> PowerLawCheck | None:
        return check_power_law(self.budgets)


def fit_budget_parabola(n, loss, sigma=None) -> tuple[np.ndarray, float, str, float]:
    """Fit loss = c2 (log N)^2 + c1 log N + c0 (weighted least squares with 1/sigma when each
    loss's standard error is given); returns (coef, x_vertex, flag reason or "", the vertex's
    standard error by the delta method, nan without sigmas)."""
    x = np.log(np.asarray(n, float))
    y = np.asarray(loss, float)
    xv_sd = float("nan")
    if sigma is None:
        coef = np.polyfit(x, y, 2)
    else:
        coef, cov = np.polyfit(x, y, 2, w=1.0 / np.asarray(sigma, float), cov="unscaled")
        grad = np.array([coef[1] / (2 * coef[0] ** 2), -1 / (2 * coef[0]), 0.0])  # d vertex / d coef
        xv_sd = float(np.sqrt(max(grad @ cov @ grad, 0.0)))
    c2, c1, _ = coef
    if c2 <= 0:
        return coef, float("nan"), "parabola opens downward (no interior minimum)", xv_sd
    xv = -c1 / (2 * c2)
    k = int(np.argmin(y))
    if k in (int(np.argmin(x)), int(np.argmax(x))):
        return coef, xv, "lowest loss at the edge of the sampled sizes", xv_sd
    if not x.min() <= xv <= x.max():
        return coef, xv, "parabola minimum outside the sampled sizes", xv_sd
    return coef, xv, "", xv_sd


def fit_isoflop(runs: pd.DataFrame, min_sizes: int = 3, weighted: bool = False) -> IsoFlopFit:
    """Approach 2 on a canonical runs table (N, D, C, loss, budget, fpt).

    ``weighted``: each parabola weights its points by 1 / ``loss_sigma`` (their measured
    standard errors), where every point has one, and the power laws weight each budget's
    vertex by the inverse of its standard error (so a noisy small budget pulls a less).

    D_opt at each budget comes from the runs' own FLOPs per token (log-log interpolated in
    N), i.e. C / (6 N_opt) when C = 6ND and C / fpt(N_opt) when attention FLOPs count.
    A budget is flagged and excluded when its minimum is at the edge of its sampled sizes.
    """
    rows = []
    for budget, g in runs.groupby("budget"):
        g = g.sort_values("N")
        sizes = g["N"].nunique()
        row = {"budget": float(budget), "n_sizes": int(sizes), "c2": np.nan, "c1": np.nan, "c0": np.nan,
               "N_opt": np.nan, "D_opt": np.nan, "loss_opt": np.nan, "log_n_sd": np.nan, "flagged": True,
               "reason": ""}
        if sizes < min_sizes:
            row["reason"] = f"only {sizes} distinct sizes (need >= {min_sizes})"
            rows.append(row)
            continue
        sigma = measured_sigma(g) if weighted else None
        coef, xv, reason, xv_sd = fit_budget_parabola(g["N"], g["loss"], sigma)
        row.update(c2=coef[0], c1=coef[1], c0=coef[2], log_n_sd=xv_sd, flagged=bool(reason), reason=reason)
        if np.isfinite(xv):
            log_fpt = np.interp(xv, np.log(g["N"]), np.log(g["fpt"]))
            if xv < np.log(g["N"].iloc[0]) or xv > np.log(g["N"].iloc[-1]):  # extrapolate fpt ∝ N^p
                p, k = np.polyfit(np.log(g["N"]), np.log(g["fpt"]), 1)
                log_fpt = k + p * xv
            with np.errstate(over="ignore"):  # a vertex far outside the sizes (flagged): inf
                row.update(N_opt=float(np.exp(xv)), D_opt=float(budget / np.exp(log_fpt)),
                           loss_opt=float(np.polyval(coef, xv)))
        rows.append(row)
    table = pd.DataFrame(rows).sort_values("budget").reset_index(drop=True)
    ok = table[~table["flagged"]]
    if len(ok) < 2:
        detail = "; ".join(f"budget {r.budget:.3g}: {r.reason}" for r in table.itertuples() if r.flagged)
        raise FitInputError(
            f"Approach 2 needs >= 2 usable IsoFLOP budgets with >= {min_sizes} sizes each and an "
            f"interior minimum; got {len(ok)} of {len(table)}. {detail}"
        )
    sd = ok["log_n_sd"].to_numpy(float)
    # D_opt = C / fpt(N_opt): its log error is p times that of N_opt, so the same relative weights
    sd = sd if np.all(np.isfinite(sd) & (sd > 0)) else None
    return IsoFlopFit(budgets=table, n_opt=PowerLaw.fit(ok["budget"], ok["N_opt"], sd),
                      d_opt=PowerLaw.fit(ok["budget"], ok["D_opt"], sd))
