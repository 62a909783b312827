"""Studies whose answer can be trusted: seed replicates, the replicate bootstrap, one FLOPs
convention, Approach 1 from real end points, the lr law of the tune stage, variant compute
multipliers and the fixed held-out set. Synthetic data of known truth; no mocks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from tests.scaling.synthetic import isoflop_runs, loss_curves, replicate, with_endpoints

from scalelab.model import Transformer
from scalelab.model.config import ModelConfig
from scalelab.scaling import FitOptions, fit_scaling_laws, write_report
from scalelab.scaling.fit import compute_multiplier, endpoint_curves, optimal_loss_at
from scalelab.scaling.heldout import HeldoutSet, evaluate_checkpoint, loss_and_se, window_losses
from scalelab.scaling.planner import make_plan
from scalelab.scaling.published_laws import CHINCHILLA, law_loss
from scalelab.scaling.shape_search import shape_for
from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec
from scalelab.scaling.tune import lr_round
from scalelab.scaling.tune_fit import fit_lr_law, grid_optimum

TRUE_A = CHINCHILLA["beta"] / (CHINCHILLA["alpha"] + CHINCHILLA["beta"])
BASE = {"vocab_size": 64, "max_seq_len": 32}
FAMILY = FamilyConfig(head_dim=8, aspect_ratio=16.0, max_layers=4)


def _plan(**kw):
    spec = SweepSpec(budgets=[3e10, 1e11], sizes_per_budget=3, size_span=4.0, **kw)
    return make_plan(spec, FAMILY, BASE, tokens_per_step=512)


# --- seeds ------------------------------------------------------------------------------------
def test_seeds_replicate_every_point_with_its_own_id_and_a_shared_group():
    one, three = _plan(), _plan(seeds=3)
    assert len(three.points) == 3 * len(one.points)
    # replicate 0 keeps the hashes a one-seed sweep always had (reruns skip it)
    assert [p.point_id for p in three.points if p.replicate == 0] == [p.point_id for p in one.points]
    assert len({p.point_id for p in three.points}) == len(three.points)
    for g in {p.group_id for p in three.points}:
        reps = [p for p in three.points if p.group_id == g]
        assert sorted(p.replicate for p in reps) == [0, 1, 2]
        assert len({(p.n_params_matmul, p.tokens, p.lr, p.steps) for p in reps}) == 1
    labels = {p.label for p in three.points}
    assert len(labels) == len(three.points)
    assert three.points[0].label.startswith("C3e10-N") and any(lb.endswith("-s2") for lb in labels)


def test_seed_replicates_of_a_wsd_sweep_branch_from_their_own_main_run():
    plan = _plan(seeds=2, wsd=True, wsd_fractions=[0.5, 1.0], min_steps=4)
    by_id = {p.point_id: p for p in plan.points}
    branches = [p for p in plan.points if p.branch_of]
    assert len(branches) == 2 * 6
    for b in branches:
        main = by_id[b.branch_of]
        assert main.replicate == b.replicate and b.branch_from == main.name
        assert b.start_step in main.save_at_steps


def test_replicate_bootstrap_uses_point_means_and_covers_the_truth():
    runs = replicate(isoflop_runs(sizes_per_budget=7, noise=0.0), k=3, noise=0.004, seed=5)
    res = fit_scaling_laws(runs, options=FitOptions(grid="coarse", n_boot=40, seed=1,
                                                    approaches=(2, 3)))
    vf = res.variants["default"]
    assert vf.boot_mode == "replicates" and len(vf.runs) == 35 and set(vf.runs["n_rep"]) == {3}
    means = runs.groupby("group_id")["loss"].mean()
    assert np.allclose(vf.runs.set_index("group_id")["loss"], means[vf.runs["group_id"]])
    assert (vf.runs["loss_sd"] > 0).all()
    for key in ("approach2.a", "approach3.a"):
        e = vf.estimates[key]
        assert e.n >= 35 and e.lo <= TRUE_A <= e.hi, (key, e)


def test_replicate_resample_has_the_unbiased_variance_of_a_mean():
    """A plain resample of 3 seeds has 2/3 of their variance; the bootstrap must not be
    narrower than the noise it measures."""
    from scalelab.scaling.fit import _resample_replicates

    reps = pd.DataFrame({"group_id": ["p"] * 3 + ["q"] * 3 + ["r"] * 2,
                         "loss": [1.0, 2.0, 3.0, 4.0, 5.5, 8.5, 5.0, 5.0]})
    points = pd.DataFrame({"group_id": ["p", "q", "r"], "loss": [2.0, 6.0, 5.0],
                           "seed_sd": [1.0, np.sqrt(5.25), 0.5], "n_rep": [3, 3, 2]})
    rng = np.random.default_rng(0)
    draws = pd.concat([_resample_replicates(reps, points, rng) for _ in range(5000)])
    for gid, mean, sd, n in points.itertuples(index=False):
        d = draws[draws["group_id"] == gid]["loss"]
        assert d.mean() == pytest.approx(mean, abs=0.03)
        # the pooled residuals of p and q have unit variance, r's are 0: 6 of 8 are unit
        assert d.var() == pytest.approx(sd**2 / n * 6 / 8, rel=0.08)  # not 2/9 of a plain resample
    # the draws are not limited to the 10 means a point's own 3 seeds allow
    assert draws[draws["group_id"] == "p"]["loss"].nunique() > 50


def test_more_seeds_narrow_the_interval():
    base = isoflop_runs(budgets=(1e18, 1e19, 1e20, 1e21), sizes_per_budget=7, noise=0.0)
    widths = []
    for k in (2, 8):
        res = fit_scaling_laws(replicate(base, k=k, noise=0.01, seed=3),
                               options=FitOptions(n_boot=60, seed=2, approaches=(2,)))
        e = res.variants["default"].estimates["approach2.a"]
        widths.append(e.hi - e.lo)
    assert widths[1] < 0.75 * widths[0], widths


# --- one FLOPs convention -----------------------------------------------------------------------
def _attention_like_runs(p: float = 0.8, k: float = 40.0) -> pd.DataFrame:
    """IsoFLOP data whose C counts fpt(N) = k N^p per token (attention-heavy tiny models)."""
    rows = []
    for c in (1e17, 1e18, 1e19, 1e20, 1e21):
        for i, x in enumerate(np.linspace(-1, 1, 9)):
            # centre the sizes on the optimum under this convention
            al, be = CHINCHILLA["alpha"], CHINCHILLA["beta"]
            a = be / (al + p * be)
            g = (al * CHINCHILLA["A"] / (p * be * CHINCHILLA["B"] * k ** be)) ** (1 / (al + p * be))
            n = g * c ** a * 10 ** x
            d = c / (k * n ** p)
            rows.append({"run_id": f"{c:.0e}_{i}", "N": n, "D": d, "C": c, "budget": c,
                         "loss": float(law_loss(n, d))})
    return pd.DataFrame(rows)


def test_approach3_allocation_uses_the_datas_flops_convention():
    p, k = 0.8, 40.0
    runs = _attention_like_runs(p, k)
    res = fit_scaling_laws(runs, options=FitOptions(grid="coarse", n_boot=0, approaches=(2, 3)))
    e = res.variants["default"].estimates
    a_true = CHINCHILLA["beta"] / (CHINCHILLA["alpha"] + p * CHINCHILLA["beta"])
    assert res.variants["default"].flops_per_token.p == pytest.approx(p, abs=1e-6)
    assert e["approach3.a"].value == pytest.approx(a_true, abs=0.01)
    assert e["approach2.a"].value == pytest.approx(a_true, abs=0.02)
    # the old 6ND closed form would disagree with Approach 2 by far more than that
    assert abs(res.variants["default"].approach3.a - e["approach2.a"].value) > 0.03
    assert e["approach3.b"].value == pytest.approx(1 - p * a_true, abs=0.01)


# --- Approach 1 from real end points ------------------------------------------------------------
def test_approach1_never_uses_intermediate_points():
    runs = isoflop_runs(sizes_per_budget=7, noise=0.0)
    res = fit_scaling_laws(runs, loss_curves(runs, points_per_run=20),
                           FitOptions(grid="coarse", n_boot=0, approaches=(1, 2)))
    vf = res.variants["default"]
    assert vf.approach1 is None and "end points" in vf.skipped[1]


def test_approach1_uses_each_sizes_end_points():
    base = isoflop_runs(sizes_per_budget=7, noise=0.0)
    runs = with_endpoints(base, fractions=(0.25, 0.5))
    ends = endpoint_curves(runs.assign(variant="default"))
    assert ends["run_id"].nunique() == len(base)  # one 'curve' per size, three end points each
    assert set(ends.groupby("run_id").size()) == {3}
    res = fit_scaling_laws(runs, None, FitOptions(grid="coarse", n_boot=0, approaches=(1,)))
    vf = res.variants["default"]
    assert vf.approach1 is not None and "end points of 35 sizes" in vf.used[1]
    assert set(vf.approach1.points["run_id"]) <= set(ends["run_id"])
    assert abs(vf.approach1.a - TRUE_A) < 0.08


# --- tune stage ---------------------------------------------------------------------------------
def test_lr_law_recovers_a_known_power_law():
    rows = []
    for n in (1e3, 4e3, 1.6e4, 6.4e4):
        best = 0.5 * n ** -0.4
        for f in (0.25, 0.5, 1, 2, 4):
            lr = best * f * 1.3  # the grid is not centred on the optimum
            rows.append({"N": n, "budget": 1e10, "lr": lr,
                         "loss": 3.0 - 0.1 * np.log(n) + 0.05 * np.log(lr / best) ** 2})
    law = fit_lr_law(pd.DataFrame(rows))
    assert law.exponent == pytest.approx(-0.4, abs=1e-6)
    assert law.coef == pytest.approx(0.5, rel=1e-6)
    assert not law.sizes["flagged"].any()


def test_lr_optimum_at_the_edge_of_the_grid_is_flagged():
    lr, _, why = grid_optimum(np.array([1e-3, 2e-3, 4e-3]), np.array([3.0, 2.9, 2.8]))
    assert lr == pytest.approx(4e-3) and "edge of the grid: widen sweep.tune_lr_factors" in why


def test_tune_plan_picks_sizes_and_the_law_sets_every_lr():
    plan = _plan(seeds=2, tune_lr_factors=[0.5, 1, 2], tune_sizes=2)
    tp = lr_round(plan, {})[0]
    assert {p.stage for p in tp.points} == {"tune"} and {p.replicate for p in tp.points} == {0}
    assert len(tp.points) == 2 * 3  # the smallest budget, its smallest and largest size
    assert {p.budget for p in tp.points} == {3e10}
    assert all(p.label.startswith("tune-C3e10-N") for p in tp.points)
    assert not {p.point_id for p in tp.points} & {p.point_id for p in plan.points}
    tuned = plan.with_lr_law(0.2, -0.3)
    assert len(tuned.points) == len(plan.points)
    for p in tuned.points:
        assert p.lr == pytest.approx(0.2 * p.n_params_matmul ** -0.3)
    assert tuned.lr_law == {"coef": 0.2, "exponent": -0.3}
    assert not {p.point_id for p in tuned.points} & {p.point_id for p in plan.points}


# --- variant compute multiplier -----------------------------------------------------------------
def test_compute_multiplier_is_the_compute_the_baseline_needs_for_the_same_loss():
    runs_a = isoflop_runs(budgets=(1e18, 1e19, 1e20, 1e21), sizes_per_budget=7, noise=0.002,
                          variant="base", seed=1)
    better = dict(CHINCHILLA, A=CHINCHILLA["A"] * 0.7)
    runs_b = isoflop_runs(budgets=(1e18, 1e19, 1e20, 1e21), sizes_per_budget=7, noise=0.002,
                          variant="better", law=better, seed=2)
    res = fit_scaling_laws(pd.concat([runs_a, runs_b], ignore_index=True),
                           options=FitOptions(grid="coarse", n_boot=8, approaches=(3,)))
    row = res.comparison.iloc[0]
    m = row["compute_multiplier"]
    assert m.value > 1.5 and m.lo < m.hi and m.lo > 1  # the better variant, significantly
    base, var = res.variants["base"], res.variants["better"]
    c = res.reference_compute
    got = optimal_loss_at(base.approach3, c * m.value, base.flops_per_token)
    assert got == pytest.approx(optimal_loss_at(var.approach3, c, var.flops_per_token), rel=1e-8)
    same = compute_multiplier(base.approach3, base.flops_per_token, base.approach3,
                              base.flops_per_token, c)
    assert same == pytest.approx(1.0, rel=1e-6)


# --- held-out set -------------------------------------------------------------------------------
def test_heldout_windows_are_fixed_and_non_overlapping():
    tokens = np.arange(10_000) % 50
    a = HeldoutSet.from_tokens(tokens, block=32, n_tokens=3200)
    b = HeldoutSet.from_tokens(tokens, block=32, n_tokens=3200)
    assert a.windows.shape == (100, 33) and np.array_equal(a.windows, b.windows)
    starts = np.arange(100) * (10_000 // 100)
    assert np.array_equal(a.windows[:, 0], tokens[starts])
    with pytest.raises(ValueError, match=r"sweep\.heldout_tokens"):
        HeldoutSet.from_tokens(tokens, block=32, n_tokens=20_000)


def test_heldout_fingerprint_names_the_set():
    tokens = np.arange(10_000) % 50
    a = HeldoutSet.from_tokens(tokens, block=32, n_tokens=3200)
    assert a.fingerprint == HeldoutSet.from_tokens(tokens.copy(), 32, 3200).fingerprint
    assert len(a.fingerprint) == 12
    others = {HeldoutSet.from_tokens(tokens, 32, 6400).fingerprint,   # size
              HeldoutSet.from_tokens(tokens, 16, 3200).fingerprint,   # window
              HeldoutSet.from_tokens((tokens + 1) % 50, 32, 3200).fingerprint}  # split or corpus
    assert a.fingerprint not in others and len(others) == 3


def test_loss_and_standard_error():
    w = np.array([1.0, 2.0, 3.0, 4.0])
    loss, se = loss_and_se(w)
    assert loss == 2.5 and se == pytest.approx(np.std(w, ddof=1) / 2)


def test_evaluate_checkpoint_matches_the_models_own_cross_entropy(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"vocab_size": 50, "max_seq_len": 16, "d_model": 16,
                                 "n_layers": 1, "n_heads": 2})
    model = Transformer(cfg)
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_cfg": cfg.to_dict() if hasattr(cfg, "to_dict")
                                     else __import__("dataclasses").asdict(cfg)}}, path)
    held = HeldoutSet.from_tokens(np.random.default_rng(0).integers(0, 50, 5000), 16, 1600)
    m = evaluate_checkpoint(path, held)
    per = window_losses(model, held.windows)
    assert m["final/heldout_loss"] == pytest.approx(per.mean(), rel=1e-6)
    assert m["final/heldout_tokens"] == 1600
    x = torch.from_numpy(held.windows)
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
    assert m["final/heldout_loss"] == pytest.approx(float(ce), rel=1e-5)
    assert 0 < m["final/heldout_se"] < 0.1


def test_a_measured_lr_law_sets_every_lr_without_tuning():
    plan = _plan(lr_law={"coef": 0.3, "exponent": -0.25})
    for p in plan.points:
        assert p.lr == pytest.approx(0.3 * p.n_params_matmul ** -0.25)
    tuned = _plan().with_lr_law(0.3, -0.25)  # the same points as after a tune stage: reruns skip
    assert [p.point_id for p in plan.points] == [p.point_id for p in tuned.points]
    with pytest.raises(ValueError, match=r"sweep\.lr_law"):
        SweepSpec(budgets=[1e10], lr_law={"coef": -1, "exponent": 0})


def test_clip_sizes_drops_targets_below_the_smallest_shape():
    spec = dict(budgets=[3e9], sizes_per_budget=7, size_span=16.0, tokens_per_param=300.0,
                min_steps=2)
    with pytest.raises(ValueError, match=r"too small|repeated shapes"):
        make_plan(SweepSpec(**spec), FAMILY, BASE, tokens_per_step=128)
    plan = make_plan(SweepSpec(**spec, clip_sizes=True), FAMILY, BASE, tokens_per_step=128)
    n = [p.n_params_matmul for p in plan.points]
    assert 3 <= len(n) < 7 and n == sorted(set(n))
    with pytest.raises(ValueError, match="clip_sizes left"):
        make_plan(SweepSpec(**dict(spec, budgets=[1e8]), clip_sizes=True), FAMILY, BASE,
                  tokens_per_step=128)


def test_fill_sizes_continues_a_clipped_grid_upward_to_k_sizes():
    # this coarse family (widths in steps of 8) has few shapes at these budgets: the filled grid
    # reaches D/N < 1, which min_tokens_per_param would refuse
    spec = dict(budgets=[3e9, 3e10], sizes_per_budget=7, size_span=16.0, tokens_per_param=300.0,
                min_steps=2, clip_sizes=True, min_tokens_per_param=0.1)
    clipped = make_plan(SweepSpec(**spec), FAMILY, BASE, tokens_per_step=128)
    filled = make_plan(SweepSpec(**spec, fill_sizes=True), FAMILY, BASE, tokens_per_step=128)
    for budget in (3e9, 3e10):
        old = [p.n_params_matmul for p in clipped.points if p.budget == budget]
        new = [p.n_params_matmul for p in filled.points if p.budget == budget]
        assert new == sorted(set(new)) and len(new) == 7
        assert new[: len(old)] == old  # the clipped sizes stay; the added ones are all larger
    assert len([p for p in clipped.points if p.budget == 3e9]) < 7  # there was something to fill
    with pytest.raises(ValueError, match=r"fill_sizes=true needs sweep\.clip_sizes"):
        SweepSpec(**dict(spec, clip_sizes=False), fill_sizes=True)


def test_laws_from_applies_an_earlier_tune_stages_laws(tmp_path):
    law = {"variants": {"default": {
        "lr": {"coef": 0.3, "exponent": -0.25, "basis": "interior", "sizes": []},
        "batch": {"coef": 40.0, "exponent": -0.3, "basis": "all", "sizes": []},
        "beta2": {"best": 0.95, "table": []}}}}
    path = tmp_path / "law.json"
    path.write_text(json.dumps(law))
    plan = _plan(laws_from=str(path))
    by_hand = _plan().with_hparams({"default": {"lr": {"coef": 0.3, "exponent": -0.25},
                                                "batch": {"coef": 40.0, "exponent": -0.3},
                                                "beta2": 0.95}})
    assert [p.point_id for p in plan.points] == [p.point_id for p in by_hand.points]
    for p in plan.points:
        assert p.lr == pytest.approx(0.3 * p.n_params_matmul ** -0.25) and p.beta2 == 0.95
    assert {p.tokens_per_step for p in plan.points} != {512}  # B*(N) rebatched the points
    with pytest.raises(ValueError, match=r"sweep\.laws_from=.*no such file"):
        _plan(laws_from=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"sweep\.laws_from=.*not a tune stage's law\.json"):
        _plan(laws_from=str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"no laws for variant\(s\) \['mlp=swiglu'\]"):
        _plan(laws_from=str(path), variants={"mlp": ["swiglu"]})
    with pytest.raises(ValueError, match=r"laws_from and sweep\.lr_law both set"):
        _plan(laws_from=str(path), lr_law={"coef": 0.1, "exponent": 0.0})
    # the report says where the hyperparameters came from
    results = fit_scaling_laws(isoflop_runs(budgets=(1e17, 1e18, 1e19), sizes_per_budget=5),
                               options=FitOptions(approaches=[2], n_boot=0, extrapolate=False))
    write_report(results, tmp_path / "report", laws_from=(str(path), plan.tuned))
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"sweep.laws_from={path}" in text
    assert "lr\\*(N) = 0.3 * N^-0.250; B\\*(N) = 40 * N^-0.300 sequences; β2 = 0.95" in text


def test_min_d_model_keeps_every_shape_at_or_above_the_narrowest_width():
    spec = SweepSpec(budgets=[3e10, 1e11], sizes_per_budget=7, size_span=16.0,
                     tokens_per_param=300.0, min_steps=2, clip_sizes=True)
    free = make_plan(spec, FAMILY, BASE, tokens_per_step=128)
    assert min(p.d_model for p in free.points) == 8  # one width step: the narrowest shape
    wide = FamilyConfig(head_dim=8, aspect_ratio=16.0, max_layers=4, min_d_model=12)  # -> 16
    plan = make_plan(spec, wide, BASE, tokens_per_step=128)
    assert min(p.d_model for p in plan.points) == 16
    assert {p.d_model for p in plan.points} == {p.d_model for p in free.points if p.d_model >= 16}
    with pytest.raises(ValueError, match=r"too small.*min_d_model"):
        shape_for(50, wide, BASE)
    with pytest.raises(ValueError, match=r"sweep\.family\.min_d_model"):
        FamilyConfig(head_dim=8, min_d_model=0)
    with pytest.raises(ValueError, match=r"min_d_model=9000 > max_d_model"):
        FamilyConfig(head_dim=8, min_d_model=9000)
