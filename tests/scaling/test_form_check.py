"""Approach 3's goodness of fit: chi2 of its log residuals against each point's measured noise."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tests.scaling.synthetic import isoflop_runs

from scalelab.scaling.fit import fit_available
from scalelab.scaling.fit_data import FitOptions
from scalelab.scaling.published_laws import law_loss, law_n_opt
from scalelab.scaling.report import write_report

NOISE = 0.005


def _study(sharpen: float = 0.0, seeds: int = 3, seed: int = 0) -> pd.DataFrame:
    """Seed replicates of a 5-budget x 7-size grid from Chinchilla's law with 0.5 % noise;
    ``sharpen`` > 0 adds sharpen * ln(N / N_opt)^2 to each relative loss: IsoFLOP curves
    sharper than the form allows."""
    runs = isoflop_runs(budgets=(1e18, 1e19, 1e20, 1e21, 1e22), sizes_per_budget=7, noise=0.0)
    rng = np.random.default_rng(seed)
    bend = 1 + sharpen * np.log(runs["N"] / law_n_opt(runs["budget"])) ** 2
    out = []
    for r in range(seeds):
        b = runs.copy()
        b["group_id"], b["run_id"] = runs["run_id"], runs["run_id"] + f"_s{r}"
        b["loss"] = law_loss(b["N"], b["D"]) * bend * (1 + NOISE * rng.standard_normal(len(b)))
        out.append(b)
    return pd.concat(out, ignore_index=True)


def _form(runs: pd.DataFrame):
    res, _ = fit_available(runs, None, FitOptions(n_boot=0, approaches=[2, 3],
                                                  flops_convention="6n", extrapolate=False))
    return next(iter(res.variants.values()))


def test_the_true_form_fits_within_the_noise():
    form = _form(_study()).form
    assert form.measured and not form.rejected, form.sentence()
    assert form.chi2 / form.dof < 2.0 and form.scale == 1.0
    assert form.noise == pytest.approx(NOISE / np.sqrt(3), rel=0.5)  # the mean of 3 seeds
    assert "fits within the noise" in form.sentence()


def test_sharper_isoflop_curves_reject_the_form_and_say_where(tmp_path):
    vf = _form(_study(sharpen=0.02))
    form = vf.form
    assert form.rejected and form.p_value < 1e-3 and form.scale > 2
    assert form.ends > 0 > form.middle
    assert "does NOT describe" in form.sentence() and "sharper than the form" in form.sentence()
    res, _ = fit_available(_study(sharpen=0.02), None, FitOptions(n_boot=20, approaches=[2, 3],
                                                                  flops_convention="6n"))
    write_report(res, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Does the form L = E + A/N^α + B/D^β describe the points?" in report
    assert "Scaled by the misfit" in report


def test_without_seeds_no_chi2_is_claimed():
    form = _form(_study(seeds=1)).form
    assert not form.measured and not form.rejected
    assert "noise not measured" in form.sentence()
