"""Hyperparameters per size: the tune stage's batch and beta2 rounds, laws per variant,
and the plan they produce. Synthetic losses of known optimum; real plans; no mocks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scalelab.scaling.plan import round_batch
from scalelab.scaling.planner import make_plan
from scalelab.scaling.stage import law_tags
from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec
from scalelab.scaling.tune import (
    VariantTune,
    batch_round,
    beta2_round,
    lr_round,
    preview_rounds,
    tune_bases,
)
from scalelab.scaling.tune_fit import (
    PowerLaw,
    choose_beta2,
    fit_lr_law,
    fit_power_law,
    grid_optimum,
    per_variant,
)

BASE = {"vocab_size": 64, "max_seq_len": 32}
FAMILY = FamilyConfig(head_dim=8, aspect_ratio=16.0, max_layers=4)
TUNE = {"tune_lr_factors": [0.5, 1, 2], "tune_sizes": 2}


def _plan(quantum: int = 1, tps: int = 512, **kw):
    spec = SweepSpec(budgets=[3e10, 1e11], sizes_per_budget=3, size_span=4.0, **(TUNE | kw))
    return make_plan(spec, FAMILY, BASE, tokens_per_step=tps, batch_quantum=quantum)


def _lr_tuned(plan, coef=0.3, exponent=-0.25):
    law = PowerLaw("lr", coef, exponent, pd.DataFrame())
    return {v: VariantTune(lr=law) for v in plan.variants}


def _grid_runs(law, factors, what, variant="default", shift=1.3):
    """Losses of a parabola in log x around law(N), on a grid not centred on the optimum."""
    rows = []
    for n in (1e3, 4e3, 1.6e4, 6.4e4):
        best = law(n)
        for f in factors:
            x = best * f * shift
            rows.append(
                {
                    "variant": variant,
                    "N": n,
                    "budget": 1e10,
                    what: x,
                    "loss": 3.0 - 0.1 * np.log(n) + 0.05 * np.log(x / best) ** 2,
                }
            )
    return pd.DataFrame(rows)


# --- fits ---------------------------------------------------------------------------------------
def test_batch_law_recovers_a_known_power_law():
    runs = _grid_runs(lambda n: 2.0 * n**0.3, (0.5, 1, 2, 4), "batch")
    law = fit_power_law(runs, "batch")
    assert law.exponent == pytest.approx(0.3, abs=1e-6)
    assert law.coef == pytest.approx(2.0, rel=1e-6)
    assert not law.sizes["flagged"].any() and "batch_opt" in law.sizes
    assert law.describe().startswith("B*(N) = 2 * N^+0.3000")


def test_too_few_interior_optima_fit_through_the_edges_not_two_close_points():
    """cpu_medium's batch round (held-out losses): 2 interior optima at N = 528 and 772, 4 at
    the small edge. A line through the 2 alone gave B*(N) ~ N^+0.98; every size says smaller."""
    losses = {  # (N, budget): losses at 16, 32, 64 sequences
        (528, 4e9): (2.8231, 2.8211, 2.8615), (1440, 4e9): (2.6646, 2.6914, 2.8760),
        (4416, 4e9): (2.8555, 3.1078, 3.1718), (772, 4e10): (2.7235, 2.7128, 2.7205),
        (4416, 4e10): (2.2445, 2.3478, 2.4815), (16152, 4e10): (2.5252, 2.6622, 2.9903),
    }
    runs = pd.DataFrame([{"N": n, "budget": c, "batch": b, "loss": loss}
                         for (n, c), ls in losses.items() for b, loss in zip((16, 32, 64), ls, strict=True)])
    law = fit_power_law(runs, "batch")
    assert law.basis == "all" and law.sizes["used"].all()
    assert int(law.sizes["flagged"].sum()) == 4
    assert law.exponent < 0 and 12 < law(16152) < 24
    assert "widen sweep.tune_batch_factors" in law.basis_note()
    assert law.as_dict()["basis"] == "all"


def test_enough_interior_optima_leave_the_edges_out():
    runs = _grid_runs(lambda n: 2.0 * n**0.3, (0.5, 1, 2, 4), "batch")
    edge = pd.DataFrame([{"variant": "default", "N": 2.56e5, "budget": 1e10, "batch": x,
                          "loss": 3.0 - 0.01 * i} for i, x in enumerate((10.0, 20.0, 40.0))])
    law = fit_power_law(pd.concat([runs, edge], ignore_index=True), "batch")
    assert law.basis == "interior" and law.basis_note() == ""
    assert list(law.sizes["used"]) == [True] * 4 + [False]
    assert law.exponent == pytest.approx(0.3, abs=1e-6)


def test_one_grid_optimum_serves_lr_and_batch_and_flags_the_edge():
    x = np.array([4.0, 8.0, 16.0, 32.0])
    loss = 2.0 + (np.log(x) - np.log(11.0)) ** 2
    assert grid_optimum(x, loss, "sweep.tune_batch_factors")[0] == pytest.approx(11.0)
    edge, _, why = grid_optimum(x, -np.log(x), "sweep.tune_batch_factors")
    assert edge == 32.0 and "widen sweep.tune_batch_factors" in why
    two, _, why = grid_optimum(x[:2], loss[:2])
    assert two == 8.0 and "fewer than 3" in why


def test_laws_are_fitted_per_variant():
    a = _grid_runs(lambda n: 0.5 * n**-0.4, (0.25, 0.5, 1, 2, 4), "lr", "mlp=gelu")
    b = _grid_runs(lambda n: 0.1 * n**-0.2, (0.25, 0.5, 1, 2, 4), "lr", "mlp=swiglu")
    laws = per_variant(pd.concat([a, b], ignore_index=True), fit_lr_law)
    assert laws["mlp=gelu"].exponent == pytest.approx(-0.4, abs=1e-6)
    assert laws["mlp=swiglu"].exponent == pytest.approx(-0.2, abs=1e-6)
    assert laws["mlp=swiglu"].coef == pytest.approx(0.1, rel=1e-6)


def test_beta2_choice_weighs_every_size_the_same():
    # the small model's loss is 4x the large one's: in nats its gaps would decide (0.95), but
    # relative to each size's best 0.99 is best on average (+1 % vs +2.5 % and +3 %)
    rows = [
        (1e3, 0.95, 8.00),
        (1e3, 0.99, 8.16),
        (1e3, 0.999, 8.40),
        (1e5, 0.95, 2.10),
        (1e5, 0.99, 2.00),
        (1e5, 0.999, 2.02),
        (1e6, 0.95, 1.50),
        (1e6, 0.99, 1.40),
    ]  # a size without every beta2 is left out
    runs = pd.DataFrame(rows, columns=["N", "beta2", "loss"]).assign(budget=1e10)
    got = choose_beta2(runs)
    assert got.best == 0.99
    table = got.table.set_index("beta2")["mean_rel_excess"]
    assert table[0.95] == pytest.approx(0.025) and table[0.99] == pytest.approx(0.01)
    assert table[0.999] == pytest.approx(0.03) and set(got.table["n_sizes"]) == {2}
    with pytest.raises(ValueError, match="every beta2"):
        choose_beta2(runs[runs["loss"] < 2.05])  # no size has all three


# --- rounds -------------------------------------------------------------------------------------
def test_batch_round_runs_at_lr_star_with_d_fixed_and_drops_what_cannot_run():
    # base batch 16 sequences of 32 tokens; 0.3 x 16 is no whole batch, 128 x 16 leaves < 10 steps
    plan = _plan(tune_batch_factors=[0.3, 0.5, 1, 2, 128])
    tuned = _lr_tuned(plan)
    tp, notes = batch_round(plan, tuned)
    bases = {(p.n_params_matmul, p.budget): p for p in tune_bases(plan)}
    assert len(bases) == 2 and len(tp.points) == 2 * 3
    assert len(notes) == 2 * 2
    assert any("factor 0.3" in n and "not a whole batch" in n for n in notes)
    assert any("factor 128" in n and "sweep.min_steps=10" in n for n in notes)
    for r in tp.points:
        p = bases[(r.n_params_matmul, r.budget)]
        seqs = r.tokens_per_step // plan.seq_len
        assert seqs == round(16 * r.batch_factor) and r.tune_round == "batch"
        assert r.steps == round(p.tokens / r.tokens_per_step) >= 10
        assert abs(r.tokens - p.tokens) <= r.tokens_per_step / 2  # D kept, up to one step
        assert r.lr == pytest.approx(0.3 * r.n_params_matmul**-0.25)
        assert r.label.endswith(f"-b{r.batch_factor:g}x") and r.stage == "tune"
    lr_ids = {p.point_id for p in lr_round(plan, tuned)[0].points}
    assert len({p.point_id for p in tp.points}) == 6 and not lr_ids & {
        p.point_id for p in tp.points
    }


def test_batch_round_drops_factors_the_micro_batch_does_not_divide():
    plan = _plan(quantum=4, tune_batch_factors=[0.25, 0.5, 1, 2])  # 4, 8, 16, 32 sequences
    _, notes = batch_round(_plan(quantum=4, tune_batch_factors=[0.125, 0.5, 1, 2]), _lr_tuned(plan))
    assert notes and all("not a multiple of 4" in n for n in notes)  # 2 sequences
    tp, notes = batch_round(plan, _lr_tuned(plan))
    assert not notes and len(tp.points) == 8


def test_beta2_round_runs_at_the_tuned_batch_and_lr():
    plan = _plan(tune_batch_factors=[0.5, 1, 2], tune_beta2s=[0.95, 0.99])
    tuned = _lr_tuned(plan)
    tuned["default"].batch = PowerLaw("batch", 0.5, 0.3, pd.DataFrame())
    tp, _ = beta2_round(plan, tuned)
    assert len(tp.points) == 2 * 2 and {p.beta2 for p in tp.points} == {0.95, 0.99}
    for r in tp.points:
        assert r.tokens_per_step // plan.seq_len == round_batch(0.5 * r.n_params_matmul**0.3)
        assert r.lr == pytest.approx(0.3 * r.n_params_matmul**-0.25)
        assert r.optim_overrides(0.1, 0.99)["optim.beta2"] == r.beta2
        assert r.label.endswith(f"-beta2_{r.beta2}")
    no_batch = beta2_round(plan, _lr_tuned(plan))[0]  # no batch round: the base batch
    assert {p.tokens_per_step for p in no_batch.points} == {plan.tokens_per_step}


def test_preview_costs_every_active_round():
    plan = _plan(tune_batch_factors=[0.5, 1, 2], tune_beta2s=[0.95, 0.99])
    rounds = preview_rounds(plan)
    assert list(rounds) == ["lr", "batch", "beta2"]
    assert [len(tp.points) for tp in rounds.values()] == [6, 6, 4]
    # D is fixed, so a size costs the same at every lr, batch and beta2 (to a step's rounding)
    per_run = rounds["lr"].total_compute / 6
    assert rounds["batch"].total_compute / 6 == pytest.approx(per_run, rel=0.02)
    assert rounds["beta2"].total_compute / 4 == pytest.approx(per_run, rel=0.02)
    assert list(preview_rounds(_plan())) == ["lr"]


# --- the plan after tuning ----------------------------------------------------------------------
def test_points_get_their_b_star_with_steps_from_their_d():
    plan = _plan()
    laws = {
        "default": {
            "lr": {"coef": 0.3, "exponent": -0.25},
            "batch": {"coef": 0.25, "exponent": 0.35},
            "beta2": 0.95,
        }
    }
    tuned = plan.with_hparams(laws)
    assert len(tuned.points) == len(plan.points)
    changed = 0
    for old, p in zip(plan.points, tuned.points, strict=True):
        want = round_batch(0.25 * p.n_params_matmul**0.35)
        seqs = p.tokens_per_step // plan.seq_len
        most = old.tokens // (plan.spec.min_steps * plan.seq_len)  # >= min_steps steps remain
        assert seqs == min(want, most) and p.steps >= plan.spec.min_steps
        assert (
            p.steps == round(old.tokens / p.tokens_per_step)
            and p.tokens == p.steps * p.tokens_per_step
        )
        assert abs(p.tokens - old.tokens) <= p.tokens_per_step / 2
        assert p.warmup_steps <= plan.spec.max_warmup_fraction * p.steps
        assert p.lr == pytest.approx(0.3 * p.n_params_matmul**-0.25) and p.beta2 == 0.95
        changed += seqs != 16
    assert changed >= 4
    assert not {p.point_id for p in tuned.points} & {p.point_id for p in plan.points}
    # the lr alone leaves batch and beta2 as they were: the same runs as a measured lr law
    lr_only = plan.with_hparams({"default": {"lr": laws["default"]["lr"]}})
    assert [p.point_id for p in lr_only.points] == [
        p.point_id for p in plan.with_lr_law(0.3, -0.25).points
    ]
    assert {p.tokens_per_step for p in lr_only.points} == {512}


def test_rounded_batch_keeps_the_micro_batch_split():
    assert [round_batch(x) for x in (0.2, 1.4, 2.6, 37.4)] == [1, 1, 3, 37]
    assert [round_batch(x, 4) for x in (0.2, 5.9, 6.1, 37.4)] == [4, 4, 8, 36]
    plan = _plan(quantum=4)
    tuned = plan.with_hparams({"default": {"batch": {"coef": 3.0, "exponent": 0.2}}})
    assert all((p.tokens_per_step // plan.seq_len) % 4 == 0 for p in tuned.points)


def test_each_variant_gets_its_own_laws():
    plan = _plan(variants={"mlp": ["gelu", "swiglu"]})
    laws = {
        "mlp=gelu": {"lr": {"coef": 0.3, "exponent": -0.25}, "beta2": 0.95},
        "mlp=swiglu": {
            "lr": {"coef": 0.1, "exponent": -0.1},
            "batch": {"coef": 0.5, "exponent": 0.3},
            "beta2": 0.999,
        },
    }
    tuned = plan.with_hparams(laws)
    for p in tuned.points:
        law = laws[p.variant]
        assert p.lr == pytest.approx(law["lr"]["coef"] * p.n_params_matmul ** law["lr"]["exponent"])
        assert p.beta2 == law["beta2"]
        if p.variant == "mlp=gelu":
            assert p.tokens_per_step == 512
    # the plan JSON records what was fitted, per variant
    saved = json.loads(json.dumps(tuned.to_dict(), default=str))
    assert saved["tuned"] == laws
    assert {r["beta2"] for r in saved["points"]} == {0.95, 0.999}


def test_law_tags_name_each_variant():
    law = PowerLaw("lr", 0.3, -0.25, pd.DataFrame())
    one = law_tags({"default": VariantTune(lr=law)})
    assert one["lr_law_coef"] == "0.3" and one["lr_law"].startswith("lr*(N) = 0.3 * N^-0.2500")
    two = law_tags({"mlp=gelu": VariantTune(lr=law), "mlp=swiglu": VariantTune(lr=law)})
    assert {"lr_law_coef.mlp_gelu", "lr_law_exponent.mlp_swiglu"} <= set(two)
    assert "[mlp=gelu]" in two["lr_law"]


# --- bad configs: one line naming the key and the fix -------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"tune_batch_factors": [1, 2]},
            r"sweep\.tune_batch_factors=.*>= 3 distinct.*\[0\.5,1,2\]",
        ),
        ({"tune_batch_factors": [0, 1, 2]}, r"sweep\.tune_batch_factors=.*positive"),
        (
            {"tune_lr_factors": [], "tune_batch_factors": [0.5, 1, 2]},
            r"sweep\.tune_batch_factors needs the lr round.*set sweep\.tune_lr_factors",
        ),
        (
            {"tune_lr_factors": [], "tune_beta2s": [0.95, 0.99]},
            r"sweep\.tune_beta2s needs the lr round",
        ),
        ({"tune_beta2s": [0.99]}, r"sweep\.tune_beta2s=.*>= 2 distinct"),
        ({"tune_beta2s": [0.95, 1.0]}, r"sweep\.tune_beta2s=.*in \(0, 1\)"),
    ],
)
def test_bad_tune_rounds_fail_with_one_clear_line(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        SweepSpec(budgets=[1e10], **(TUNE | kw))
    assert "\n" not in str(e.value)


def test_a_tuned_point_trains_at_its_batch_beta2_and_steps(tmp_path):
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec
    from scalelab.scaling.base_run import BaseRun
    from scalelab.scaling.point_config import point_overrides, train_command, write_point_config
    from scalelab.scaling.sweep_settings import RunSettings

    plan = _plan().with_hparams(
        {"default": {"batch": {"coef": 40.0, "exponent": 0.0}, "beta2": 0.95}}
    )
    p = plan.points[0]
    assert p.tokens_per_step == 40 * 32
    settings = RunSettings(
        name="t",
        train_overrides=[
            "model=gpt2_tiny",
            "model.max_seq_len=32",
            "train.global_batch_size=16",
            "tokenizer=byte",
        ],
    )
    base = BaseRun(
        cfg=None,
        model_fields=BASE,
        tokens_per_step=512,
        micro_batch=16,
        block_size=32,
        train_tokens=None,
        tracking_uri="sqlite:///x.db",
        artifact_root=None,
        root=tmp_path,
        accelerator="cpu",
    )
    ov = point_overrides(p, plan.spec, settings, base, tmp_path, "PARENT", "sweep_t")
    write_point_config(tmp_path / "conf" / "sweep_point" / f"{p.name}.yaml", p, ov)
    # what scalelab-train gets: the shared overrides (the preset's batch of 16 among them
    # would win over the point's), the point's config
    cmd = train_command(settings.train_overrides, [p.name], tmp_path / "conf", multirun=False)
    cfg = compose("train", cmd[3:])
    spec = build_spec(cfg)  # exactly the validation scalelab-train does
    assert cfg.train.global_batch_size == 40 and cfg.optim.beta2 == 0.95
    assert spec.batch.tokens_per_step == p.tokens_per_step and spec.max_steps == p.steps
