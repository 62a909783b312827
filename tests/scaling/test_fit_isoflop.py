"""Approaches 1 (envelope) and 2 (IsoFLOP parabolas) recover a known law; edge budgets are flagged."""

import numpy as np
import pandas as pd
import pytest
from tests.scaling.synthetic import isoflop_runs, loss_curves

from scalelab.scaling import FitInputError, FitOptions, prepare_curves, prepare_runs
from scalelab.scaling.fit_isoflop import PowerLaw, fit_budget_parabola, fit_envelope, fit_isoflop
from scalelab.scaling.published_laws import CHINCHILLA, law_n_opt

TRUE_A = CHINCHILLA["beta"] / (CHINCHILLA["alpha"] + CHINCHILLA["beta"])  # 0.4516
TRUE_B = 1 - TRUE_A


def _prep(df):
    return prepare_runs(df, FitOptions())


def test_power_law_fit_exact():
    c = np.geomspace(1e17, 1e21, 5)
    law = PowerLaw.fit(c, 3.0 * c**0.5)
    assert law.exponent == pytest.approx(0.5)
    assert law.coefficient == pytest.approx(3.0)


def test_approach2_recovers_exponents():
    runs = _prep(isoflop_runs(sizes_per_budget=7, noise=0.005, seed=0))
    fit = fit_isoflop(runs)
    assert not fit.budgets["flagged"].any()
    assert abs(fit.a - TRUE_A) < 0.05
    assert abs(fit.b - TRUE_B) < 0.05
    # C = 6ND here, so D_opt = C / (6 N_opt) exactly.
    np.testing.assert_allclose(fit.budgets["D_opt"], fit.budgets["budget"] / (6 * fit.budgets["N_opt"]))
    # Vertices land near the true optimum (within 0.15 decades).
    err = np.log10(fit.budgets["N_opt"]) - np.log10(law_n_opt(fit.budgets["budget"]))
    assert np.abs(err).max() < 0.15


def test_approach2_edge_budget_flagged_and_excluded():
    good = isoflop_runs(budgets=(1e17, 1e18, 1e19, 1e20), sizes_per_budget=7, noise=0.002, seed=1)
    # Largest budget sampled only above its optimum: the lowest loss sits at the smallest size.
    edge = isoflop_runs(budgets=(1e21,), sizes_per_budget=7, span=0.5, center_shift=1.2, noise=0.002, seed=2)
    fit = fit_isoflop(_prep(pd.concat([good, edge], ignore_index=True)))
    row = fit.budgets.set_index("budget").loc[1e21]
    assert bool(row["flagged"]) and "edge" in row["reason"]
    assert len(fit.usable) == 4
    assert abs(fit.a - TRUE_A) < 0.05


def test_parabola_flags():
    n = np.geomspace(1e6, 1e8, 5)
    x = np.log(n)
    _, _, reason, _ = fit_budget_parabola(n, -((x - x.mean()) ** 2))  # opens downward
    assert "downward" in reason
    _, _, reason, _ = fit_budget_parabola(n, (x - x.mean()) ** 2 + 1)
    assert reason == ""


def test_approach2_too_few_sizes_or_budgets():
    df = isoflop_runs(budgets=(1e18, 1e19), sizes_per_budget=2)
    with pytest.raises(FitInputError, match="Approach 2 needs >= 2 usable"):
        fit_isoflop(_prep(df))


def test_approach2_uses_flops_per_token_for_d_opt():
    df = isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5, noise=0.0)
    # Pretend attention adds 10 % FLOPs per token: D_opt = C / (6.6 N_opt).
    df["flops_per_token"] = 6.6 * df["N"]
    runs = prepare_runs(df, FitOptions(flops_convention="attention"))
    fit = fit_isoflop(runs)
    b = fit.budgets
    np.testing.assert_allclose(b["D_opt"], b["budget"] / (6.6 * b["N_opt"]), rtol=1e-6)


def test_approach1_envelope_recovers_exponents():
    runs_df = isoflop_runs(sizes_per_budget=9, noise=0.0)
    runs = _prep(runs_df)
    curves = prepare_curves(loss_curves(runs_df, points_per_run=30), runs)
    fit = fit_envelope(curves)
    assert abs(fit.a - TRUE_A) < 0.05
    assert abs(fit.b - TRUE_B) < 0.05
    assert fit.points["N_opt"].nunique() >= 5


def test_approach1_needs_curves_of_two_sizes():
    runs_df = isoflop_runs(budgets=(1e18,), sizes_per_budget=1)
    runs = _prep(runs_df)
    with pytest.raises(FitInputError, match="Approach 1"):
        fit_envelope(prepare_curves(loss_curves(runs_df), runs))
