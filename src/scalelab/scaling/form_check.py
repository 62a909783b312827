"""Does Approach 3's form L(N, D) = E + A/N^alpha + B/D^beta describe the points it was fitted
to, within their measured noise?

Approach 2 has its own check (is N_opt(C) a power law?). Approach 3's estimates and its
extrapolations (the hold-out check, the allocation beyond the largest budget) rest on the form,
and its bootstrap intervals cover the noise of the points, not the choice of form. So the
report compares the fit's log residuals with each point's relative standard error: chi2 with
points - 5 degrees of freedom, and where along the IsoFLOP curves the misfit sits. Residuals
that are high at both ends of every curve and low in its middle mean the curves are sharper
than the form allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from .fit_data import measured_sigma
from .fit_parametric import ParametricFit

FREE_PARAMETERS = 5  # E, A, B, alpha, beta


@dataclass
class FormCheck:
    n_points: int
    rms: float  # root mean square of log(loss / fitted loss): ~ the relative misfit
    noise: float  # median relative standard error of a point; nan when not measured
    chi2: float  # sum of (log residual / relative standard error)^2; nan without noise
    dof: int
    p_value: float
    ends: float  # mean log residual of the smallest and largest size of each budget
    middle: float  # ... and of the sizes between them

    @property
    def measured(self) -> bool:
        return math.isfinite(self.chi2) and self.dof > 0

    @property
    def rejected(self) -> bool:
        return self.measured and self.p_value < 0.05

    @property
    def scale(self) -> float:
        """sqrt(chi2 / dof) when the form is rejected (the Birge ratio: how much wider the
        intervals would be if the misfit were noise), else 1."""
        return math.sqrt(self.chi2 / self.dof) if self.rejected else 1.0

    def sentence(self) -> str:
        """One line for the report and the command line."""
        if not self.measured:
            return (f"rms log residual {self.rms:.2%} over {self.n_points} points (noise not "
                    "measured: no chi2; use sweep.seeds >= 2)")
        p = "p < 0.001" if self.p_value < 1e-3 else f"p = {self.p_value:.3f}"
        head = (f"rms log residual {self.rms:.2%} against a median noise of {self.noise:.2%} "
                f"(chi2 {self.chi2:.1f} on {self.dof} dof, {p})")
        if not self.rejected:
            return head + ": the form fits within the noise"
        shape = ""
        if math.isfinite(self.ends) and self.ends > 0 > self.middle:
            shape = (f"; the end sizes of each IsoFLOP curve lie {self.ends:+.2%} and the "
                     f"middle ones {self.middle:+.2%} off it: the curves are sharper than the "
                     "form allows")
        return (head + ": the form does NOT describe these points" + shape + ". Its estimates "
                "and extrapolations (the hold-out check, the allocation beyond the data) carry "
                "this misfit, which the bootstrap intervals do not cover")


def check_form(fit: ParametricFit, points: pd.DataFrame) -> FormCheck:
    """:class:`FormCheck` of ``fit`` on the per-point table it was fitted to (point_means)."""
    loss = points["loss"].to_numpy(float)
    resid = np.log(loss) - np.log(fit.predict(points["N"].to_numpy(float),
                                              points["D"].to_numpy(float)))
    sigma = measured_sigma(points)
    dof = len(points) - FREE_PARAMETERS
    chi2 = p = noise = float("nan")
    if sigma is not None and dof > 0:
        rel = sigma / loss
        noise = float(np.median(rel))
        chi2 = float(np.sum((resid / rel) ** 2))
        p = float(stats.chi2.sf(chi2, dof))
    rank = points.groupby("budget")["N"].rank(method="first")
    count = points.groupby("budget")["N"].transform("size")
    at_end = ((rank == 1) | (rank == count)).to_numpy() & (count >= 3).to_numpy()
    inner = ~((rank == 1) | (rank == count)).to_numpy() & (count >= 3).to_numpy()
    ends = float(resid[at_end].mean()) if at_end.any() else float("nan")
    middle = float(resid[inner].mean()) if inner.any() else float("nan")
    return FormCheck(len(points), float(np.sqrt(np.mean(resid**2))), noise, chi2, dof, p,
                     ends, middle)
