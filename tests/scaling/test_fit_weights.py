"""Fits weighted by each point's measured noise (FitOptions.weights="noise")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import minimize
from tests.scaling.synthetic import isoflop_runs

from scalelab.scaling import FitOptions, fit_scaling_laws
from scalelab.scaling.fit import noise_weights, point_means
from scalelab.scaling.fit_isoflop import fit_isoflop
from scalelab.scaling.fit_parametric import _make_fun, fit_parametric, theta_of
from scalelab.scaling.published_laws import CHINCHILLA, law_loss


def _noisy_replicates(seed: int, k: int = 3, quiet: float = 0.002, loud: float = 0.04,
                      budgets=(1e17, 1e18, 1e19, 1e20, 1e21)) -> pd.DataFrame:
    """k seeds of an IsoFLOP grid whose largest-N third (few tokens: the runs that are
    noisy in a real small study) scatters 20x more than the rest."""
    runs = isoflop_runs(budgets=budgets, sizes_per_budget=9, noise=0.0)
    rng = np.random.default_rng(seed)
    loud_point = runs.groupby("budget")["N"].rank() > 6
    sd = np.where(loud_point, loud, quiet)
    out = []
    for r in range(k):
        b = runs.copy()
        b["group_id"], b["run_id"] = runs["run_id"], runs["run_id"] + f"_s{r}"
        b["loss"] = law_loss(b["N"], b["D"]) * (1 + sd * rng.standard_normal(len(b)))
        out.append(b)
    return pd.concat(out, ignore_index=True)


def test_weighted_gradient_matches_finite_differences():
    runs = isoflop_runs(noise=0.01)
    ln, ld, ll = (np.log(runs[c].to_numpy()) for c in ("N", "D", "loss"))
    w = np.random.default_rng(0).uniform(0.2, 3.0, len(ll))
    fun = _make_fun(ln, ld, ll, 1e-3, "sum", w)
    x = np.array([6.0, 6.1, 0.5, 0.33, 0.29])
    _, g = fun(x)
    eps = 1e-7
    num = np.array([(fun(x + eps * e)[0] - fun(x - eps * e)[0]) / (2 * eps) for e in np.eye(5)])
    np.testing.assert_allclose(g, num, rtol=1e-4, atol=1e-9)
    # the weights change the objective: with all-ones weights it differs
    assert fun(x)[0] != pytest.approx(_make_fun(ln, ld, ll, 1e-3, "sum")(x)[0], rel=1e-3)


def test_weighted_batched_optimum_cannot_be_improved_by_lbfgsb():
    runs = isoflop_runs(noise=0.01)
    w = np.random.default_rng(1).uniform(0.2, 3.0, len(runs))
    fit = fit_parametric(runs["N"], runs["D"], runs["loss"], grid="coarse", weights=w)
    assert fit.options["weighted"] is True
    ln, ld, ll = (np.log(runs[c].to_numpy()) for c in ("N", "D", "loss"))
    fun = _make_fun(ln, ld, ll, 1e-3, "sum", w)
    res = minimize(fun, theta_of(fit), jac=True, method="L-BFGS-B",
                   options={"ftol": 1e-14, "gtol": 1e-14, "maxiter": 10000})
    assert res.fun >= fit.objective * (1 - 1e-9)


@pytest.mark.parametrize("bad", [np.zeros(45), np.full(45, np.nan), np.ones(3)])
def test_bad_weights_are_refused(bad):
    runs = isoflop_runs()
    with pytest.raises(ValueError, match="weights"):
        fit_parametric(runs["N"], runs["D"], runs["loss"], grid="small", weights=bad)


def test_point_sigma_combines_modelled_seed_spread_and_heldout_error():
    runs = _noisy_replicates(0)
    runs["loss_se"] = 0.003
    pts = point_means(runs.assign(fpt=6 * runs["N"], variant="default"))
    g = runs.groupby("group_id")["loss"]
    np.testing.assert_allclose(pts.set_index("group_id")["loss_sd"], g.std().loc[pts["group_id"]])
    expected = np.sqrt(pts["seed_sd"] ** 2 / 3 + 0.003**2)
    np.testing.assert_allclose(pts["loss_sigma"], expected)
    # the model is smooth in N and D: the loud third (largest N) gets the largest seed sd
    loud = pts["N"] > pts.groupby("budget")["N"].transform(lambda n: n.sort_values().iloc[5])
    assert pts.loc[loud, "seed_sd"].median() > 3 * pts.loc[~loud, "seed_sd"].median()
    w = noise_weights(pts)
    assert np.median(w) == pytest.approx(1.0)
    # one seed: the noise is not measured, so nothing is weighted
    single = point_means(runs[runs["run_id"].str.endswith("_s0")].assign(fpt=1.0, variant="v"))
    assert single["loss_sigma"].isna().all() and noise_weights(single) is None


def test_noise_weights_give_closer_exponents_when_some_points_are_noisy():
    """Over 4 noise draws, the weighted fits land nearer the true law than the unweighted
    ones for Approach 2's a and Approach 3's alpha and beta."""
    err = {"noise": [], "none": []}
    for seed in range(4):
        runs = _noisy_replicates(seed)
        for w in err:
            vf = fit_scaling_laws(runs, options=FitOptions(n_boot=0, grid="coarse", weights=w,
                                                           extrapolate=False)).variants["default"]
            err[w].append([abs(vf.approach2.a - true_a()), abs(vf.approach3.alpha - CHINCHILLA["alpha"]),
                           abs(vf.approach3.beta - CHINCHILLA["beta"])])
    weighted, plain = np.mean(err["noise"], axis=0), np.mean(err["none"], axis=0)
    assert np.all(weighted < 0.75 * plain), (weighted, plain)  # measured: 0.61, 0.23, 0.38


def test_isoflop_vertex_and_power_law_weighted_by_measured_noise():
    budgets = (1e18, 1e19, 1e20, 1e21)
    runs = isoflop_runs(budgets=budgets, sizes_per_budget=7, noise=0.0)
    runs["loss_sigma"], runs["fpt"] = 0.001, 6 * runs["N"]
    clean = np.log(fit_isoflop(runs).budgets["N_opt"])  # the parabola's own bias, no noise
    # one point per budget is 3 % too high but says it is uncertain: the weighted parabola
    # hardly moves, the unweighted one does
    far = runs.groupby("budget")["N"].rank() == 6
    runs.loc[far, "loss"] *= 1.03
    runs.loc[far, "loss_sigma"] = 0.5
    plain, weighted = fit_isoflop(runs), fit_isoflop(runs, weighted=True)
    err_plain = np.abs(np.log(plain.budgets["N_opt"]) - clean).min()
    err_weighted = np.abs(np.log(weighted.budgets["N_opt"]) - clean).max()
    assert err_weighted < 0.005 and err_plain > 0.05  # measured: 0.0015 and 0.057-0.105
    assert weighted.budgets["log_n_sd"].gt(0).all() and plain.budgets["log_n_sd"].isna().all()
    # a budget whose whole profile is noisy (vertex uncertain) pulls the power law less
    noisy = runs.copy()
    first = noisy["budget"] == budgets[0]
    noisy.loc[first, "loss"] = noisy.loc[first, "loss"] * (1 + 0.02 * np.sin(np.arange(first.sum())))
    noisy.loc[first, "loss_sigma"] = 0.05
    noisy.loc[far & ~first, "loss"] /= 1.03
    noisy.loc[far & ~first, "loss_sigma"] = 0.001
    assert abs(fit_isoflop(noisy, weighted=True).a - true_a()) < abs(fit_isoflop(noisy).a - true_a())


def true_a() -> float:
    return CHINCHILLA["beta"] / (CHINCHILLA["alpha"] + CHINCHILLA["beta"])


def test_unknown_weighting_is_refused():
    with pytest.raises(ValueError, match="weights"):
        FitOptions(weights="inverse")


def test_ablation_script_adds_an_unweighted_row(tmp_path):
    """scripts/scaling_ablation.py on a 3-seed study: the unweighted row is a different fit."""
    import subprocess
    import sys
    from pathlib import Path

    runs = _noisy_replicates(0, budgets=(1e18, 1e19, 1e20))
    runs["replicate"] = runs["run_id"].str[-1].astype(int)
    runs.to_csv(tmp_path / "runs.csv", index=False)
    script = Path(__file__).resolve().parents[2] / "scripts" / "scaling_ablation.py"
    untuned = runs[runs["replicate"] == 0].assign(loss=runs["loss"] * 1.01)
    untuned.to_csv(tmp_path / "untuned.csv", index=False)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "runs.csv"), "--n-boot", "0",
                          "--untuned", str(tmp_path / "untuned.csv")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert "weights: none (every point counts the same)" in rows and "full study (3 seeds)" in rows
    assert "seeds: 1 instead of 3" in rows
    assert "tuning: none (untuned sweep, 1 seed)" in rows  # its own seed count
    assert rows["weights: none (every point counts the same)"].split("|")[2:] != \
        rows["full study (3 seeds)"].split("|")[2:]
