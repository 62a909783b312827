"""fit_scaling_laws end to end on synthetic data: CIs, extrapolation, conventions, variants, errors."""

import functools

import numpy as np
import pandas as pd
import pytest
from tests.scaling.synthetic import isoflop_runs, loss_curves, with_endpoints

from scalelab.scaling import FitInputError, FitOptions, fit_scaling_laws, prepare_runs
from scalelab.scaling.published_laws import CHINCHILLA

TRUE_A = CHINCHILLA["beta"] / (CHINCHILLA["alpha"] + CHINCHILLA["beta"])
FAST = {"grid": "coarse", "n_boot": 20, "seed": 0}


@pytest.fixture(scope="module")
def results():
    # WSD-style end points (each size also trained to 1/4 and 1/2 of its D) for Approach 1
    runs = with_endpoints(isoflop_runs(sizes_per_budget=7, noise=0.005, seed=0), noise=0.005)
    return fit_scaling_laws(runs, None, FitOptions(**FAST))


def test_all_approaches_and_cis(results):
    vf = results.variants["default"]
    est = vf.estimates
    assert vf.approach1 is not None and vf.approach2 is not None and vf.approach3 is not None
    for key in ("approach1.a", "approach2.a", "approach3.a"):
        assert abs(est[key].value - TRUE_A) < 0.05, key
    # Every fitted quantity has a bootstrap interval that brackets its point estimate's neighbourhood.
    for key in ("approach3.alpha", "approach3.beta", "approach3.E", "approach3.A", "approach3.B",
                "approach3.a", "approach3.b", "approach3.tokens_per_param", "approach2.a", "approach2.b"):
        e = est[key]
        assert e.n >= 18 and e.lo < e.hi, key  # a real interval, not a point
        assert e.lo <= e.value <= e.hi, (key, e)  # around the estimate it belongs to
    # Bootstrap CIs contain the true values.
    for key, truth in (("approach3.alpha", 0.34), ("approach3.beta", 0.28), ("approach3.a", TRUE_A),
                       ("approach2.a", TRUE_A)):
        assert est[key].lo <= truth <= est[key].hi, (key, est[key])


def test_extrapolation_small_on_clean_data():
    runs = isoflop_runs(sizes_per_budget=7, noise=0.001, seed=3)
    res = fit_scaling_laws(runs, options=FitOptions(approaches=(2, 3), grid="coarse", n_boot=0))
    ex = res.variants["default"].extrapolation
    assert ex.held_out_budget == 1e21 and ex.n_train_points == 28
    assert ex.actual_source == "IsoFLOP parabola minimum"
    assert abs(ex.rel_error) < 0.01
    assert ex.predicted_n_opt == pytest.approx(ex.actual_n_opt, rel=0.25)


def test_the_frontier_power_law_predicts_where_the_loss_has_no_floor():
    # E = 0: L_opt(C) is exactly k C^-gamma with gamma = alpha beta / (alpha + beta), so the
    # form-free check lands on the held-out minimum; with Chinchilla's E > 0 the loss flattens
    # and the power law through the smaller budgets predicts too low a loss, where Approach 3,
    # whose form is the truth here, does not
    no_floor = {**CHINCHILLA, "E": 0.0}
    gamma = no_floor["alpha"] * no_floor["beta"] / (no_floor["alpha"] + no_floor["beta"])
    opts = FitOptions(approaches=(2, 3), grid="coarse", n_boot=0)
    ex = fit_scaling_laws(isoflop_runs(sizes_per_budget=7, noise=0.0, law=no_floor),
                          options=opts).variants["default"].extrapolation
    assert abs(ex.frontier_error) < 0.01 and ex.frontier_gamma == pytest.approx(gamma, rel=0.05)
    ex = fit_scaling_laws(isoflop_runs(sizes_per_budget=7, noise=0.0),
                          options=opts).variants["default"].extrapolation
    assert ex.frontier_error < -0.01 and abs(ex.rel_error) < 0.01


def test_c_defaults_to_6nd_with_note_and_is_used_when_given():
    runs = isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5).drop(columns=["C", "budget"])
    t = prepare_runs(runs, FitOptions())
    assert np.allclose(t["C"], 6 * t["N"] * t["D"])
    assert any("6*N*D" in n for n in t.attrs["notes"])
    assert t["budget"].nunique() == 3  # budgets grouped from C
    runs["C"] = 7.0 * runs["N"] * runs["D"]
    t = prepare_runs(runs, FitOptions())
    assert np.allclose(t["C"], 7 * t["N"] * t["D"]) and not t.attrs["notes"]


def test_conventions_pick_columns():
    df = pd.DataFrame({"n_params": [3e6, 6e6], "n_params_non_embedding": [1e6, 4e6],
                       "n_params_matmul": [2e6, 5e6], "D": [1e8, 1e8], "loss": [3.0, 2.9],
                       "flops": [1.3e15, 3.3e15], "flops_6n": [1.2e15, 3.0e15]})
    assert list(prepare_runs(df, FitOptions())["N"]) == [2e6, 5e6]
    assert list(prepare_runs(df, FitOptions(n_convention="total"))["N"]) == [3e6, 6e6]
    assert list(prepare_runs(df, FitOptions(n_convention="non_embedding"))["N"]) == [1e6, 4e6]
    assert list(prepare_runs(df, FitOptions())["C"]) == [1.3e15, 3.3e15]
    assert list(prepare_runs(df, FitOptions(flops_convention="6n"))["C"]) == [1.2e15, 3.0e15]
    with pytest.raises(ValueError, match="n_convention"):
        FitOptions(n_convention="kaplan")


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.drop(columns=["loss"]), "missing column 'loss'"),
        (lambda d: d.drop(columns=["N"]), "missing column for N"),
        (lambda d: d.assign(D=-d["D"]), "column 'D' .* positive"),
        (lambda d: d.assign(loss=np.where(d.index == 2, 0.0, d["loss"])), "row 2"),
        (lambda d: d.head(4), "Approach 3 needs >= 5"),
    ],
)
def test_bad_input_errors(mutate, match):
    runs = mutate(isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5))
    with pytest.raises(FitInputError, match=match):
        fit_scaling_laws(runs, options=FitOptions(approaches=(3,), n_boot=0, grid="coarse", extrapolate=False))


def test_variants_fitted_separately_and_compared():
    better = {**CHINCHILLA, "A": 300.0}  # same exponents, smaller model term: lower loss everywhere
    runs = pd.concat([isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5, noise=0.003, seed=1,
                                   variant="gelu"),
                      isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5, noise=0.003, seed=2,
                                   variant="swiglu", law=better)], ignore_index=True)
    res = fit_scaling_laws(runs, options=FitOptions(approaches=(2, 3), grid="coarse", n_boot=8, extrapolate=False))
    assert list(res.variants) == ["gelu", "swiglu"]
    row = res.comparison.iloc[0]
    assert row["variant"] == "swiglu" and row["baseline"] == "gelu"
    assert row["loss_ratio"].value < 1 and row["better"] == "swiglu"
    assert row["loss_ratio"].lo <= row["loss_ratio"].value <= row["loss_ratio"].hi


def test_degenerate_law_gives_nan_frontier_not_crash():
    from scalelab.scaling import ParametricFit
    f = ParametricFit(E=1.0, A=1e11, B=5.0, alpha=-0.1, beta=0.5, objective=0.0, n_points=5,
                      n_starts=1, converged_starts=1, seconds=0.0)
    assert np.isnan(f.G) and np.isnan(f.n_opt(1e20))


def test_unusable_curves_skip_approach1_with_reason():
    runs = isoflop_runs(budgets=(1e18, 1e19, 1e20), sizes_per_budget=5, noise=0.002)
    curves = loss_curves(runs[runs["N"] == runs["N"].min()], points_per_run=5)  # one size only
    res = fit_scaling_laws(runs, curves, FitOptions(approaches=(1, 2), n_boot=0))
    vf = res.variants["default"]
    assert vf.approach1 is None and "Approach 1" in vf.skipped[1]
    assert vf.approach2 is not None


@functools.cache  # tests share fits: each takes seconds
def _holdout_fit(noise: float, seeds: int = 3, floor: bool = True):
    from tests.scaling.synthetic import replicate

    law = CHINCHILLA if floor else {**CHINCHILLA, "E": 0.0}
    runs = isoflop_runs(sizes_per_budget=7, noise=0.0 if seeds > 1 else noise, law=law)
    if seeds > 1:
        runs = replicate(runs, k=seeds, noise=noise, law=law)
    opts = FitOptions(approaches=(2, 3), grid="coarse", n_boot=30, seed=0)
    return fit_scaling_laws(runs, options=opts).variants["default"]


def _holdout(noise: float, seeds: int = 3, floor: bool = True):
    return _holdout_fit(noise, seeds, floor).extrapolation


@pytest.mark.parametrize("seeds", [3, 1])
def test_the_hold_out_errors_have_intervals_that_tell_a_right_form_from_a_wrong_one(seeds):
    # the data follow Chinchilla's law, floor included: Approach 3's form is the truth, so its
    # error's interval covers 0; the floor-less power law through the minima predicts too low,
    # and its interval says so
    ex = _holdout(0.005, seeds)
    assert ex.n_boot >= 27
    lo, hi = ex.error_ci
    assert lo < 0 < hi and lo <= ex.rel_error <= hi
    flo, fhi = ex.frontier_error_ci
    assert flo <= ex.frontier_error <= fhi < -0.01


def test_the_hold_out_intervals_widen_with_the_points_noise():
    quiet, noisy = _holdout(0.003), _holdout(0.01)
    for attr in ("error_ci", "frontier_error_ci"):
        (qlo, qhi), (nlo, nhi) = getattr(quiet, attr), getattr(noisy, attr)
        assert nhi - nlo > 2 * (qhi - qlo), attr  # 5x the noise: the replicates are refitted


def test_the_sweep_logs_both_hold_out_errors_and_their_intervals():
    from scalelab.cli.sweep_fit import extrapolation_line

    ex = _holdout(0.005)
    metrics: dict[str, float] = {}
    line = extrapolation_line(ex, "", "", metrics)
    assert metrics["fit/extrapolation_rel_error"] == ex.rel_error
    assert (metrics["fit/extrapolation_rel_error_lo"], metrics["fit/extrapolation_rel_error_hi"]) == ex.error_ci
    assert metrics["fit/extrapolation_frontier_rel_error_hi"] == ex.frontier_error_ci[1]
    assert f"error {ex.rel_error:+.2%} [{ex.error_ci[0]:+.2%}, {ex.error_ci[1]:+.2%}]" in line
    assert metrics["fit/frontier_power_law_p"] == ex.frontier_p < 1e-6  # Chinchilla's floor bends it
    assert f"(one power law through all the minima: p = {ex.frontier_p:.2g})" in line


def test_the_power_law_through_the_minima_is_checked_against_their_bootstrap_spread():
    from scipy import stats

    # E = 0: L_opt(C) is one power law, and the check agrees; with Chinchilla's floor the
    # minima bend away from it, far beyond their noise
    from scalelab.scaling.report import _frontier_check_md

    vf = _holdout_fit(0.003, floor=False)
    straight = vf.extrapolation
    assert straight.frontier_dof == 3 and stats.chi2.sf(straight.frontier_chi2, 3) > 0.05
    lo, hi = straight.frontier_error_ci
    assert lo < 0 < hi
    assert "power law?** consistent: chi2" in _frontier_check_md(vf)[0]
    vf = _holdout_fit(0.003)
    bent = vf.extrapolation
    assert bent.frontier_dof == 3 and stats.chi2.sf(bent.frontier_chi2, 3) < 1e-6
    assert "power law?** **rejected** (p < 0.05)" in _frontier_check_md(vf)[0]
