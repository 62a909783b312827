"""The hold-out check: fit without the largest budget, predict that budget's compute-optimal loss.

Two predictors, both from the smaller budgets only:

- Approach 3's form L = E + A/N^α + B/D^β at the held-out budget's optimal (N, D);
- without a form in N and D, the power law L_opt = k C^-γ through the smaller budgets'
  IsoFLOP minima (Kaplan's L(C)).

Each is compared with the held-out budget's own IsoFLOP parabola minimum. The bootstrap of the
study refits both on every replicate, so each error comes with an interval: it covers the
points' noise on both sides of the comparison (the prediction's and the held-out minimum's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .fit_isoflop import IsoFlopFit

NAN_PAIR = (float("nan"), float("nan"))
# the bootstrap columns of the two errors
BOOT_KEYS = ("holdout.error", "holdout.frontier_error")


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
    # a second predictor that assumes no functional form in N and D: the power law
    # L_opt = k C^-gamma through the other budgets' IsoFLOP minima (Kaplan's L(C))
    frontier_loss: float = float("nan")
    frontier_gamma: float = float("nan")
    # bootstrap percentile intervals of rel_error and frontier_error (nan without bootstrap)
    error_ci: tuple[float, float] = NAN_PAIR
    frontier_error_ci: tuple[float, float] = NAN_PAIR
    n_boot: int = 0
    # does L_opt follow one power law through all budgets' minima? chi2 of the weighted line
    # in (ln C, ln L_opt), each minimum's error its bootstrap spread (nan without bootstrap)
    frontier_chi2: float = float("nan")
    frontier_dof: int = 0

    @property
    def frontier_error(self) -> float:
        return (self.frontier_loss - self.actual_loss) / self.actual_loss

    @property
    def frontier_p(self) -> float:
        """p-value of one power law L_opt(C) through all the minima (nan: not tested)."""
        if self.frontier_dof <= 0:
            return float("nan")
        from scipy import stats

        return float(stats.chi2.sf(self.frontier_chi2, self.frontier_dof))


def held_out_budget(runs: pd.DataFrame) -> float | None:
    """The largest budget, when >= 3 budgets leave >= 2 to fit below it; else None."""
    budgets = np.sort(runs["budget"].unique())
    return float(budgets[-1]) if len(budgets) >= 3 else None


def actual_optimum(test: pd.DataFrame, iso_all: IsoFlopFit | None,
                   held: float) -> tuple[float, str, float]:
    """(loss, where it comes from, N_opt) of the held-out budget: its parabola minimum when
    Approach 2 fitted it unflagged, else its lowest observed loss (and no N_opt)."""
    if iso_all is not None:
        row = iso_all.budgets[iso_all.budgets["budget"] == held]
        if len(row) and not bool(row["flagged"].iloc[0]):
            return float(row["loss_opt"].iloc[0]), "IsoFLOP parabola minimum", float(row["N_opt"].iloc[0])
    return float(test["loss"].min()), "lowest observed loss", float("nan")


def frontier_prediction(budgets: pd.DataFrame, held: float) -> tuple[float, float]:
    """(L_opt at ``held``, gamma) from ln L_opt = c - gamma ln C through the unflagged budgets'
    parabola minima; nan with fewer than 2 of them."""
    ok = budgets[~budgets["flagged"].astype(bool)]
    if len(ok) < 2:
        return float("nan"), float("nan")
    slope, icpt = np.polyfit(np.log(ok["budget"].astype(float)), np.log(ok["loss_opt"].astype(float)), 1)
    return float(np.exp(icpt + slope * math.log(held))), float(-slope)


def with_intervals(check: ExtrapolationCheck, boot: pd.DataFrame, ci: float) -> ExtrapolationCheck:
    """``check`` with the percentile intervals of its two errors over the bootstrap replicates."""
    lo_q, hi_q = (1 - ci) / 2, 1 - (1 - ci) / 2
    out = []
    for key in BOOT_KEYS:
        col = boot[key].to_numpy(float) if key in boot else np.array([])
        col = col[np.isfinite(col)]
        out.append((float(np.quantile(col, lo_q)), float(np.quantile(col, hi_q)), len(col))
                   if len(col) >= 2 else (*NAN_PAIR, 0))
    (lo, hi, n), (flo, fhi, _) = out
    check.error_ci, check.frontier_error_ci, check.n_boot = (lo, hi), (flo, fhi), n
    return check


MINIMUM_KEY = "approach2.loss_opt@"  # + the budget: a bootstrap column of each parabola minimum


def minima(iso: IsoFlopFit | None) -> dict[str, float]:
    """Each unflagged budget's parabola minimum, as bootstrap columns."""
    if iso is None:
        return {}
    ok = iso.budgets[~iso.budgets["flagged"].astype(bool)]
    return {f"{MINIMUM_KEY}{b:g}": float(v) for b, v in zip(ok["budget"], ok["loss_opt"], strict=True)}


def frontier_fit_check(budgets: pd.DataFrame, boot: pd.DataFrame) -> tuple[float, int]:
    """(chi2, dof) of ln L_opt = c - gamma ln C through every unflagged budget's minimum,
    weighted by each minimum's bootstrap sd; (nan, 0) with < 3 minima or no bootstrap."""
    ok = budgets[~budgets["flagged"].astype(bool)]
    x, y, sd = [], [], []
    for b, loss in zip(ok["budget"].astype(float), ok["loss_opt"].astype(float), strict=True):
        col = boot.get(f"{MINIMUM_KEY}{b:g}")
        spread = np.nanstd(col.to_numpy(float), ddof=1) if col is not None and col.notna().sum() >= 3 else np.nan
        if np.isfinite(spread) and spread > 0:
            x.append(math.log(b))
            y.append(math.log(loss))
            sd.append(spread / loss)  # sd of ln L_opt
    if len(x) < 3:
        return float("nan"), 0
    xa, ya, sda = np.array(x), np.array(y), np.array(sd)
    line = np.polyfit(xa, ya, 1, w=1 / sda)
    return float(np.sum(((ya - np.polyval(line, xa)) / sda) ** 2)), len(x) - 2


def fmt_error(err: float, ci: tuple[float, float]) -> str:
    """'+6.56%', or '+6.56% [+4.10%, +8.92%]' with an interval."""
    text = f"{err:+.2%}"
    return text if not np.isfinite(ci[0]) else f"{text} [{ci[0]:+.2%}, {ci[1]:+.2%}]"
