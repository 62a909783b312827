"""The forecast (scaling/forecast.py) on synthetic studies from known laws: it must place runs
it has never seen, say which forms describe the points, and keep its intervals honest."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tests.scaling.synthetic import SMALL_LAW, family_shape, study_runs, true_optimum

from scalelab.scaling.forecast import (
    CONVENTIONS,
    FORM_TOLERANCE,
    Backtest,
    backtest_note,
    convention_points,
    cross_validate,
    exponent_by_convention,
    kept_forms,
    make_forecast,
    point_means,
)
from scalelab.scaling.forecast_forms import fit_form
from scalelab.scaling.published_laws import law_loss


@pytest.fixture(scope="module")
def chinchilla_study():
    runs = study_runs()
    return runs, make_forecast(runs, [10, 100], family_shape, n_boot=20)


def test_forecast_of_a_chinchilla_law_is_close_and_covered(chinchilla_study):
    _, fc = chinchilla_study
    for t, tol in zip(fc.targets, (0.01, 0.02), strict=True):
        n_true, _ = true_optimum(t.budget)
        assert t.n_lo <= n_true <= t.n_hi, (t.multiple, t.n_lo, n_true, t.n_hi)
        assert t.n_star == pytest.approx(n_true, rel=0.25)
        for run in t.runs:  # every run's loss is forecast and its interval covers the truth
            actual = float(law_loss(run.shape["n_params_matmul"], run.tokens, SMALL_LAW))
            assert run.loss_lo <= actual <= run.loss_hi, (t.multiple, run.role)
            if run.role == "optimum":
                assert abs(run.loss_pred / actual - 1) <= tol, (t.multiple, run.loss_pred, actual)
        roles = {r.role: r.shape["n_params_matmul"] for r in t.runs}
        assert roles["smaller"] < roles["optimum"] < roles["larger"]


def test_cross_validation_keeps_the_forms_that_fit_and_drops_a_wrong_one(chinchilla_study):
    _, fc = chinchilla_study
    assert "chinchilla" in fc.kept  # the true form
    # Kaplan's form has no floor: on a law with E = 1.2 it misses the unseen budgets
    assert fc.cv_error["kaplan"] > fc.cv_error["chinchilla"]
    best = min(fc.cv_error.values())
    for form, err in fc.cv_error.items():
        assert (form in fc.kept) == (err <= max(FORM_TOLERANCE[0] * best, best + FORM_TOLERANCE[1]))
    assert 0.002 < fc.run_sd < 0.01  # the generator's 0.5 % seed noise, measured from the seeds


def test_a_power_law_with_a_floor_study_is_forecast_by_the_frontier_forms():
    """Points on L*(C) = E + k C^-g with IsoFLOP parabolas around it: only the frontier forms
    describe them, and cross-validation says so."""
    rows = []
    rng = np.random.default_rng(3)
    for c in (4e9, 1e10, 2.5e10, 6.3e10, 1.6e11):
        n_opt, l_opt = 0.05 * c**0.5, 1.0 + 400 * c**-0.25
        for i, n in enumerate(np.geomspace(n_opt / 4, n_opt * 4, 7)):
            shape = family_shape(float(n))
            loss = l_opt + 0.02 * np.log(n / n_opt) ** 2
            for r in range(2):
                rows.append(shape | {"budget": c, "D": c / shape["flops_per_token"],
                                     "loss": loss * (1 + 0.002 * rng.standard_normal()),
                                     "group_id": f"{c}-{i}", "replicate": r, "stage": "main"})
    runs = pd.DataFrame(rows)
    fc = make_forecast(runs, [10], family_shape, n_boot=20)
    assert set(fc.kept) <= {"power_law", "power_law_floor"}
    t = fc.targets[0]
    truth = 1.0 + 400 * t.budget**-0.25
    opt = t.runs[0]
    assert opt.loss_lo <= truth <= opt.loss_hi
    assert opt.loss_pred == pytest.approx(truth, rel=0.01)


def test_each_counting_convention_moves_a_and_the_span_covers_them():
    runs = study_runs(seeds=2)
    table = exponent_by_convention(runs, n_boot=30).set_index("convention")
    assert list(table.index) == [*CONVENTIONS, "all four"]
    per = table.loc[list(CONVENTIONS)]
    assert per["a"].max() - per["a"].min() > 0.03  # total N (with embeddings) grows more slowly
    assert (per["a_lo"] < per["a"]).all() and (per["a"] < per["a_hi"]).all()
    span = table.loc["all four"]
    assert span["a_lo"] == per["a_lo"].min() and span["a_hi"] == per["a_hi"].max()


def test_too_few_budgets_forecast_unvalidated_with_a_note():
    runs = study_runs(budgets=(4e9, 1.6e10), seeds=1)
    fc = make_forecast(runs, [10], family_shape, n_boot=5)
    assert all(not np.isfinite(v) for v in fc.cv_error.values())
    assert "not validated" in fc.notes[0]
    assert fc.kept and set(fc.kept) <= {"chinchilla", "kaplan"}


def test_no_form_fits_is_one_clear_error():
    runs = study_runs(budgets=(4e9,), sizes=3, seeds=1)
    with pytest.raises(ValueError, match=r"sweep\.forecast_multiples=\[\]"):
        make_forecast(runs, [10], family_shape, n_boot=0)


def test_kept_forms_tolerance():
    assert kept_forms({"a": 0.01, "b": 0.019, "c": 0.021, "d": float("inf")}) == ["a", "b"]
    assert kept_forms({"a": 0.0005, "b": 0.0029}) == ["a", "b"]  # both within the noise floor
    assert kept_forms({"a": float("inf")}) == []


def test_each_form_recovers_its_own_law():
    runs = study_runs(seeds=1, noise=0.0)
    pts = convention_points(point_means(runs), "matmul")
    fit = fit_form("chinchilla", pts)
    assert fit.fit.alpha == pytest.approx(SMALL_LAW["alpha"], rel=0.02)
    assert fit.fit.beta == pytest.approx(SMALL_LAW["beta"], rel=0.02)
    cv = cross_validate(point_means(runs), "matmul")
    assert cv["chinchilla"] < 1e-4  # noise-free: the true form predicts unseen budgets exactly
    assert cv["kaplan"] > 10 * cv["chinchilla"]


def test_the_interval_grows_with_the_distance_of_the_forecast():
    """A frontier that steepens (the study's small budgets lag the law): the forward
    extrapolation error is measured, and the 100x interval is wider than the 10x one by more
    than the bootstrap alone makes it."""
    rows = []
    for c in (4e9, 1e10, 2.5e10, 6.3e10, 1.6e11):
        n_opt = 0.05 * c**0.5
        l_opt = 3.0 * (c / 4e9) ** (-0.06 - 0.02 * np.log10(c / 4e9))  # local slope steepens
        for i, n in enumerate(np.geomspace(n_opt / 4, n_opt * 4, 5)):
            shape = family_shape(float(n))
            rows.append(shape | {"budget": c, "D": c / shape["flops_per_token"],
                                 "loss": l_opt + 0.03 * np.log(n / n_opt) ** 2,
                                 "group_id": f"{c}-{i}", "replicate": 0, "stage": "main"})
    fc = make_forecast(pd.DataFrame(rows), [10, 100], family_shape, n_boot=10)
    assert fc.per_decade > 0.005
    assert any("each too high" in n and "runs high too" in n for n in fc.notes), fc.notes
    (near, far) = (t.runs[0] for t in fc.targets)
    assert (far.loss_hi - far.loss_lo) / far.loss_pred > 1.8 * (near.loss_hi - near.loss_lo) / near.loss_pred


def test_backtests_of_the_true_law_show_no_direction_of_error(chinchilla_study):
    _, fc = chinchilla_study
    assert any(n.startswith("forward backtests") and n.endswith("beyond the seed noise")
               for n in fc.notes), fc.notes


def test_a_direction_is_claimed_only_when_every_backtest_clears_the_seed_noise():
    def tests(*errs: float) -> list[Backtest]:
        return [Backtest(1e10 * 10**k, 0.4, np.array([e, e, e])) for k, e in enumerate(errs)]

    assert "each too low" in backtest_note(tests(-0.02, -0.03), run_sd=0.006)
    assert "+5.0%, +7.5% per decade, each too high" in backtest_note(tests(0.02, 0.03), 0.006)
    assert "no direction" in backtest_note(tests(0.02, 0.004), run_sd=0.006)  # one within noise
    assert "no direction" in backtest_note(tests(0.02, -0.03), run_sd=0.006)
    assert backtest_note(tests(0.02), run_sd=0.006) is None  # one backtest: no pattern


def test_a_forecast_that_is_not_trained_is_reported_without_outcomes(tmp_path):
    """sweep.forecast_train=false: forecast.csv with no actual loss, and the report's section
    and the console lines say so instead of failing on the missing runs."""
    from scalelab.scaling.forecast_report import forecast_md
    from scalelab.scaling.forecast_stage import (
        FORECAST_COLUMNS,
        ForecastResult,
        outcome_table,
        summary_lines,
        target_table,
    )

    runs = study_runs(seeds=2)
    fc = make_forecast(runs, [10], family_shape, n_boot=5)
    trained = outcome_table([], pd.DataFrame())
    table = target_table(fc, trained)
    assert list(table.columns) == FORECAST_COLUMNS and table["loss_actual"].isna().all()
    result = ForecastResult(fc, table, trained, {}, runs)
    assert summary_lines(result) == [summary_lines(result)[0]]
    assert "not trained" in summary_lines(result)[0]
    md, files = forecast_md(result, runs, tmp_path, n_boot=5)
    assert "not trained" in "\n".join(md) and all(f.is_file() for f in files)
