"""Hyperparameters per size: with two or more tune budgets the laws are fitted in
(N, D), and every point gets the lr and batch of its own N and D. Synthetic losses of known
optimum; real plans, real law.json files; no mocks."""

from __future__ import annotations

import json
from io import StringIO

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from scalelab.cli.sweep_plan import print_plan
from scalelab.scaling.laws import read_laws
from scalelab.scaling.planner import make_plan
from scalelab.scaling.stage import law_tags
from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec
from scalelab.scaling.tune import VariantTune, batch_round, beta2_round, tune_bases
from scalelab.scaling.tune_fit import PowerLaw, fit_power_law

BASE = {"vocab_size": 64, "max_seq_len": 32}
FAMILY = FamilyConfig(head_dim=8, aspect_ratio=16.0, max_layers=4)
LR_ND = {"coef": 2.0, "exponent": -0.3, "d_exponent": -0.2}


def _runs(budgets, law=LR_ND, what="lr"):
    """A parabola in log x around law(N, D) per size, D = C / 6N, on a grid off the optimum."""
    rows = []
    for c in budgets:
        for n in (1e3, 4e3, 1.6e4):
            d = c / (6 * n)
            best = law["coef"] * n ** law["exponent"] * d ** law.get("d_exponent", 0.0)
            for f in (0.25, 0.5, 1, 2, 4):
                x = best * f * 1.3
                loss = 3.0 - 0.1 * np.log(n) + 0.05 * np.log(x / best) ** 2
                rows.append({"N": n, "budget": c, "D": d, what: x, "loss": loss})
    return pd.DataFrame(rows)


def _plan(tune: bool = True, **kw):
    grid = {"tune_lr_factors": [0.5, 1, 2], "tune_sizes": 2} if tune else {}
    spec = SweepSpec(budgets=[3e10, 1e11], sizes_per_budget=3, size_span=4.0, **grid, **kw)
    return make_plan(spec, FAMILY, BASE, tokens_per_step=512)


def test_optima_of_two_budgets_separate_the_n_and_d_exponents():
    law = fit_power_law(_runs([1e10, 1e11]), "lr")
    assert law.exponent == pytest.approx(-0.3, abs=1e-6)
    assert law.d_exponent == pytest.approx(-0.2, abs=1e-6)
    assert law.coef == pytest.approx(2.0, rel=1e-6)
    assert law.describe().startswith("lr*(N, D) = 2 * N^-0.3000 * D^-0.2000")
    assert law(1e4, 1e6) == pytest.approx(2.0 * 1e4**-0.3 * 1e6**-0.2)
    with pytest.raises(ValueError, match="needs the tokens D"):
        law(1e4)


def test_one_budget_gives_a_law_in_n_that_folds_the_d_exponent_in():
    """Along one IsoFLOP curve D ~ C / N: the two exponents are not separable, and the line's
    slope is p - q. This is the law that does not carry to 10x the tokens."""
    law = fit_power_law(_runs([1e10]), "lr")
    assert law.d_exponent == 0.0 and "D" not in law.describe()
    assert law.exponent == pytest.approx(-0.3 + 0.2, abs=1e-6)
    at_ten_times = 2.0 * 4e3**-0.3 * (1e11 / 2.4e4) ** -0.2
    assert law(4e3) > 1.5 * at_ten_times  # the N-only law overshoots lr* at 10x the budget


def test_too_few_optima_over_two_budgets_give_a_line_and_say_so():
    runs = _runs([1e10, 1e11])
    keep = ((runs["budget"] == 1e10) & (runs["N"] < 1e4)) | (
        (runs["budget"] == 1e11) & (runs["N"] == 1.6e4))
    runs = runs[keep]  # 2 sizes at 1e10 and 1 at 1e11: 3 optima over 2 budgets
    law = fit_power_law(runs, "lr")
    assert law.d_exponent == 0.0 and law.basis == "interior"
    assert "no law in (N, D): it needs >= 4 usable optima" in law.basis_note()
    assert fit_power_law(_runs([1e10, 1e11]), "lr").basis_note() == ""


def test_every_point_gets_the_lr_and_batch_of_its_own_n_and_d():
    plan = _plan()
    batch = {"coef": 0.05, "exponent": -0.1, "d_exponent": 0.3}
    tuned = plan.with_hparams({"default": {"lr": LR_ND, "batch": batch}})
    by_n: dict[int, set[float]] = {}
    for old, p in zip(plan.points, tuned.points, strict=True):
        n, d = old.n_params_matmul, old.tokens
        assert p.lr == pytest.approx(2.0 * n**-0.3 * d**-0.2)
        want = min(round(0.05 * n**-0.1 * d**0.3), d // (plan.spec.min_steps * plan.seq_len))
        assert p.tokens_per_step // plan.seq_len == max(want, 1)
        by_n.setdefault(n, set()).add(p.lr)
    assert any(len(lrs) == 2 for lrs in by_n.values())  # one N, two budgets, two lrs


def test_later_rounds_run_each_tune_size_at_its_own_d():
    plan = _plan(tune_budgets=[3e10, 1e11], tune_batch_factors=[0.5, 1, 2],
                 tune_beta2s=[0.95, 0.99])
    law = PowerLaw("lr", LR_ND["coef"], LR_ND["exponent"], pd.DataFrame(),
                   d_exponent=LR_ND["d_exponent"])
    tuned = {"default": VariantTune(lr=law)}
    assert len({p.budget for p in tune_bases(plan)}) == 2
    for rnd in (batch_round, beta2_round):
        for p in rnd(plan, tuned)[0].points:
            base = next(b for b in tune_bases(plan)
                        if b.n_params_matmul == p.n_params_matmul and b.budget == p.budget)
            assert p.lr == pytest.approx(law(base.n_params_matmul, base.tokens))


def test_law_json_carries_the_d_exponent_to_later_sweeps_tags_and_text(tmp_path):
    law = fit_power_law(_runs([1e10, 1e11]), "lr")
    t = VariantTune(lr=law)
    path = tmp_path / "law.json"
    path.write_text(json.dumps({"variants": {"default": t.as_dict()}}, default=float))
    assert read_laws(str(path))["default"]["lr"]["d_exponent"] == pytest.approx(-0.2)
    plan = _plan(tune=False, laws_from=str(path))
    assert plan.points[0].lr == pytest.approx(law(plan.points[0].n_params_matmul,
                                                  plan.points[0].tokens))
    tags = law_tags({"default": t})
    assert tags["lr_law_d_exponent"] == "-0.2000" and "D^-0.2000" in tags["lr_law"]
    measured = _plan(tune=False, lr_law={"coef": 2.0, "exponent": -0.3, "d_exponent": -0.2})
    assert [p.lr for p in measured.points] == pytest.approx([p.lr for p in plan.points])
    out = StringIO()
    print_plan(measured, None, Console(file=out, width=400))
    assert "lr*(N, D) = 2 * N^-0.300 * D^-0.200" in out.getvalue()


def test_a_bad_lr_law_key_is_one_clear_line():
    with pytest.raises(ValueError, match=r"sweep.lr_law=.*d_exponent: q adds \* D\^q"):
        _plan(tune=False, lr_law={"coef": 2.0, "exponent": -0.3, "d": -0.2})


def test_the_tune_plot_draws_a_law_in_n_and_d_along_each_budget(tmp_path):
    from scalelab.scaling.tune_plot import plot_tune

    runs = _runs([1e10, 1e11]).assign(variant="default", round="lr")
    law = fit_power_law(runs, "lr")
    path = plot_tune(runs, {"default": VariantTune(lr=law)}, tmp_path / "tune.png")
    assert path.stat().st_size > 10_000
