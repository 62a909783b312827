"""Approach 2 tests its own model: do the IsoFLOP vertices lie on one power law N_opt ∝ C^a?"""

from __future__ import annotations

import pandas as pd
import pytest
from tests.scaling.synthetic import isoflop_runs, replicate

from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
from scalelab.scaling.published_laws import CHINCHILLA

# a = beta / (alpha + beta): Chinchilla's 0.45, and a law whose optimum grows with C as 0.71
STEEP = {"E": 1.69, "A": 406.4, "B": 4107.0, "alpha": 0.2, "beta": 0.5}


def _a(law: dict[str, float]) -> float:
    return law["beta"] / (law["alpha"] + law["beta"])


def _seeds(budgets, law, seed: int) -> pd.DataFrame:
    grid = isoflop_runs(budgets=budgets, sizes_per_budget=7, span=0.5, noise=0.0, law=law)
    return replicate(grid, k=3, noise=0.003, seed=seed, law=law)


def _fit(runs: pd.DataFrame, n_boot: int = 0):
    opts = FitOptions(approaches=[2], n_boot=n_boot, extrapolate=False)
    return fit_scaling_laws(runs, options=opts).variants["default"]


def test_one_power_law_passes_and_its_local_exponents_match_the_law():
    vf = _fit(_seeds((1e17, 1e18, 1e19, 1e20, 1e21), CHINCHILLA, seed=3))
    check = vf.approach2.power_law_check
    assert check is not None and check.dof == 3
    assert not check.misfit and check.p_value > 0.05
    assert abs(check.curvature) < 3 * check.curvature_se
    for r in check.local.itertuples():
        assert r.a == pytest.approx(_a(CHINCHILLA), abs=3 * r.a_se)


def test_a_bend_is_rejected_and_located():
    # the optimum follows a = 0.45 up to 1e19 FLOPs and a = 0.71 from 1e20 on
    runs = pd.concat([_seeds((1e17, 1e18, 1e19), CHINCHILLA, seed=4),
                      _seeds((1e20, 1e21, 1e22), STEEP, seed=5)], ignore_index=True)
    check = _fit(runs).approach2.power_law_check
    assert check.misfit and check.p_value < 1e-3 and check.scale > 2
    assert check.curvature > 3 * check.curvature_se
    first, last = check.local.iloc[0], check.local.iloc[-1]
    assert first["a"] == pytest.approx(_a(CHINCHILLA), abs=3 * first["a_se"])
    assert last["a"] == pytest.approx(_a(STEEP), abs=3 * last["a_se"])
    assert "rejected" in check.summary()


def test_the_report_widens_a_by_the_misfit_and_says_why(tmp_path):
    runs = pd.concat([_seeds((1e17, 1e18, 1e19), CHINCHILLA, seed=4),
                      _seeds((1e20, 1e21, 1e22), STEEP, seed=5)], ignore_index=True)
    vf = _fit(runs, n_boot=30)
    results = fit_scaling_laws(runs, options=FitOptions(approaches=[2], n_boot=30, extrapolate=False))
    write_report(results, tmp_path)
    text = (tmp_path / "report.md").read_text()
    check = vf.approach2.power_law_check
    est = results.variants["default"].estimates["approach2.a"]
    widened = check.scale * (est.hi - est.lo) / 2
    assert "**Does N_opt follow a power law?** N_opt ∝ C^a rejected" in text
    assert f"it is ±{widened:.3f}" in text


def test_one_seed_cannot_be_tested_and_the_report_says_so(tmp_path):
    runs = isoflop_runs(budgets=(1e17, 1e18, 1e19, 1e20), sizes_per_budget=7, span=0.5, noise=0.003)
    results = fit_scaling_laws(runs, options=FitOptions(approaches=[2], n_boot=0, extrapolate=False))
    assert results.variants["default"].approach2.power_law_check is None
    write_report(results, tmp_path)
    assert "Not tested: that needs >= 3 usable budgets" in (tmp_path / "report.md").read_text()
