"""The functional forms a forecast chooses among, each fitted to a study's point means.

Two forms describe only the compute-optimal frontier, through each budget's IsoFLOP minimum:
- ``power_law``: L*(C) = k C^-g;
- ``power_law_floor``: L*(C) = E + k C^-g, with 0 <= E < the lowest minimum (a bounded floor).
Both take N*(C) as a power law through the minima and the loss of a model r times N* from the
IsoFLOP parabolas' curvature, itself a power law in C: L = L*(C) + c2(C) (ln r)^2.

Two describe every point, L(N, D):
- ``chinchilla``: E + A/N^alpha + B/D^beta (Hoffmann et al. 2022; scaling/fit_parametric.py);
- ``kaplan``: [(Nc/N)^(alpha_N/alpha_D) + Dc/D]^alpha_D (Kaplan et al. 2020, eq. 1.5), a
  coupled form with no floor.

Every fitted form answers ``loss(n, d, c)`` for a run of n parameters, d tokens and compute c,
all three counted in the convention it was fitted in. Pure numpy/scipy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit, least_squares

from .fit_isoflop import fit_budget_parabola
from .fit_parametric import ParametricFit, theta_of

FORMS = ("power_law", "power_law_floor", "chinchilla", "kaplan")
# the frontier forms need this many interior IsoFLOP minima (one more than their parameters)
MIN_MINIMA = {"power_law": 3, "power_law_floor": 4}


@dataclass
class Frontier:
    """L*(C), N*(C) and the parabola curvature c2(C) through a study's IsoFLOP minima."""

    log_k: float
    g: float
    floor: float
    n_coef: np.ndarray  # ln N* = polyval(n_coef, ln C)
    c2_coef: np.ndarray  # ln c2 = polyval(c2_coef, ln C)

    def optimal_loss(self, c) -> np.ndarray:
        return self.floor + np.exp(self.log_k - self.g * np.log(c))

    def loss(self, n, d, c) -> np.ndarray:
        log_c = np.log(np.asarray(c, float))
        off = np.log(np.asarray(n, float)) - np.polyval(self.n_coef, log_c)
        return self.optimal_loss(c) + np.exp(np.polyval(self.c2_coef, log_c)) * off**2


@dataclass
class Chinchilla:
    fit: ParametricFit

    def loss(self, n, d, c) -> np.ndarray:
        return self.fit.predict(n, d)


@dataclass
class Kaplan:
    theta: np.ndarray  # ln Nc, ln Dc, alpha_N, alpha_D

    def loss(self, n, d, c) -> np.ndarray:
        return np.exp(_kaplan_log(self.theta, np.log(np.asarray(n, float)),
                                  np.log(np.asarray(d, float))))


def _kaplan_log(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    ln_nc, ln_dc, a_n, a_d = theta
    return a_d * np.logaddexp(a_n / a_d * (ln_nc - log_n), ln_dc - log_d)


def budget_minima(pts: pd.DataFrame) -> pd.DataFrame:
    """Each budget's IsoFLOP minimum (budgets with an interior one): budget, c (the compute
    at the vertex, in the points' convention), n, loss, c2 (the parabola's curvature)."""
    rows = []
    for budget, g in pts.groupby("budget"):
        if g["n"].nunique() < 3:
            continue
        g = g.sort_values("n")
        coef, xv, reason, _ = fit_budget_parabola(g["n"], g["loss"])
        if reason:
            continue
        c = float(np.exp(np.interp(xv, np.log(g["n"]), np.log(g["c"]))))
        rows.append({"budget": float(budget), "c": c, "n": float(np.exp(xv)),
                     "loss": float(np.polyval(coef, xv)), "c2": float(coef[0])})
    return pd.DataFrame(rows, columns=["budget", "c", "n", "loss", "c2"])


def fit_form(name: str, pts: pd.DataFrame, start: object | None = None) -> object | None:
    """Fit form ``name`` to point means (columns budget, n, d, c, loss); None where the points
    cannot fix it (too few interior minima, no convergence). ``start``: a fitted form of the
    same kind whose parameters start the search (the bootstrap's refits)."""
    if name in MIN_MINIMA:
        return _fit_frontier(budget_minima(pts), floor=name == "power_law_floor")
    if name == "chinchilla":
        return _fit_chinchilla(pts, start)
    if name == "kaplan":
        return _fit_kaplan(pts, start)
    raise ValueError(f"unknown form {name!r}; the forms are {FORMS}")


def _fit_frontier(minima: pd.DataFrame, floor: bool) -> Frontier | None:
    if len(minima) < MIN_MINIMA["power_law_floor" if floor else "power_law"]:
        return None
    log_c = np.log(minima["c"].to_numpy(float))
    loss = minima["loss"].to_numpy(float)
    n_coef = np.polyfit(log_c, np.log(minima["n"].to_numpy(float)), 1)
    c2 = minima["c2"].to_numpy(float)
    c2_coef = np.polyfit(log_c, np.log(c2), 1)
    if not floor:
        slope, log_k = np.polyfit(log_c, np.log(loss), 1)
        return Frontier(float(log_k), float(-slope), 0.0, n_coef, c2_coef)
    mid = float(np.mean(log_c))

    def f(x, e, log_k, g):  # centred in log C, so that log_k and g are not degenerate
        return e + np.exp(log_k - g * (x - mid))

    top = 0.99 * float(loss.min())
    try:
        (e, log_k, g), _ = curve_fit(f, log_c, loss, p0=(0.5 * top, np.log(0.5 * loss.mean()), 0.1),
                                     bounds=([0.0, -20.0, 0.0], [top, 20.0, 3.0]), maxfev=20_000)
    except (RuntimeError, ValueError):
        return None
    return Frontier(float(log_k + g * mid), float(g), float(e), n_coef, c2_coef)


def _fit_chinchilla(pts: pd.DataFrame, start: object | None) -> Chinchilla | None:
    """E + A/N^alpha + B/D^beta in Hoffmann's log-sum-exp parametrisation, by least squares on
    the log residuals from 16 starts, or from ``start``'s parameters (a bootstrap refit). Not
    the Huber fit of scaling/fit_parametric.py: that is ~10x slower, and a forecast refits the
    form hundreds of times."""
    log_n, log_d, log_l = (np.log(pts[k].to_numpy(float)) for k in ("n", "d", "loss"))
    if len(pts) < 6:
        return None

    def resid(theta):
        a, b, e, alpha, beta = theta
        return np.logaddexp(np.logaddexp(a - alpha * log_n, b - beta * log_d), e) - log_l

    if isinstance(start, Chinchilla):
        starts = [theta_of(start.fit)]
    else:
        starts = [np.array([a, b, min(0.0, log_l.min() - 0.1), al, be])
                  for a in (5.0, 15.0) for b in (5.0, 15.0) for al in (0.3, 0.8) for be in (0.3, 0.8)]
    top = float(log_l.min())
    best = None
    for x0 in starts:
        x0 = np.clip(x0, [-50, -50, -10, 0.01, 0.01], [80, 80, top - 1e-6, 3.0, 3.0])
        r = least_squares(resid, x0,
                          bounds=([-50, -50, -10, 0.01, 0.01], [80, 80, top, 3.0, 3.0]))
        if best is None or r.cost < best.cost:
            best = r
    a, b, e, alpha, beta = best.x
    fit = ParametricFit(E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)),
                        alpha=float(alpha), beta=float(beta), objective=float(best.cost),
                        n_points=len(log_l), n_starts=len(starts), converged_starts=1, seconds=0.0)
    return Chinchilla(fit)


_KAPLAN_STARTS = [(s_n, s_d, a_n, a_d) for s_n in (3.0, 10.0) for s_d in (3.0, 10.0)
                  for a_n in (0.1, 0.4) for a_d in (0.1, 0.4)]


def _fit_kaplan(pts: pd.DataFrame, start: object | None) -> Kaplan | None:
    log_n, log_d, log_l = (np.log(pts[k].to_numpy(float)) for k in ("n", "d", "loss"))
    if len(pts) < 5:
        return None

    def resid(theta):
        return _kaplan_log(theta, log_n, log_d) - log_l

    if isinstance(start, Kaplan):
        starts = [start.theta]
    else:
        starts = [np.array([log_n.max() + s_n, log_d.max() + s_d, a_n, a_d])
                  for s_n, s_d, a_n, a_d in _KAPLAN_STARTS]
    best = None
    for x0 in starts:
        r = least_squares(resid, x0, bounds=([-np.inf, -np.inf, 1e-3, 1e-3],
                                             [np.inf, np.inf, 5.0, 5.0]))
        if best is None or r.cost < best.cost:
            best = r
    return Kaplan(best.x) if best is not None and np.isfinite(best.cost) else None
