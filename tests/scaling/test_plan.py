"""Planner invariants: FLOPs per point hit the budget, sizes are log-spaced, bad plans fail early."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.model.config import ModelConfig
from scalelab.scaling.planner import make_plan, variant_grid
from scalelab.scaling.shape_search import optimal_size_prior, shape_for
from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec

BASE = {"vocab_size": 256, "max_seq_len": 128}
TPS = 16 * 128  # tokens per optimizer step
FAMILY = FamilyConfig(head_dim=16, aspect_ratio=32, max_layers=12)


def _plan(**kw):
    spec = SweepSpec(**({"budgets": [1e12, 3e12, 1e13], "sizes_per_budget": 5,
                         "size_span": 16.0} | kw))
    return make_plan(spec, FAMILY, BASE, TPS, train_tokens=100_000_000)


def test_training_flops_equal_budget_within_one_step():
    plan = _plan()
    assert len(plan.points) == 15
    for p in plan.points:
        cfg = ModelConfig.from_dict(BASE | p.model_overrides)
        # N and FLOPs come from ModelConfig, the single source of truth
        assert p.n_params_matmul == cfg.n_params_matmul()
        assert p.flops_per_token == cfg.flops_per_token()
        assert p.tokens == p.steps * TPS
        # rounding to whole steps moves C by at most half a step's FLOPs
        assert abs(p.compute - p.budget) <= 0.5 * TPS * p.flops_per_token
        assert abs(p.compute / p.budget - 1) < 0.01


def test_sizes_evenly_spaced_in_log_n_around_prior():
    plan = _plan()
    for budget in plan.spec.budgets:
        pts = sorted((p for p in plan.points if p.budget == budget), key=lambda p: p.size_index)
        log_n = np.log([p.n_params_matmul for p in pts])
        assert np.all(np.diff(log_n) > 0), "sizes must increase"
        gaps = np.diff(log_n)
        ideal = math.log(16.0) / 4
        # discrete widths (multiples of 16) at tiny sizes: each gap within 40% of the ideal
        assert np.all(np.abs(gaps - ideal) < 0.4 * ideal), (budget, np.exp(gaps))
        assert abs((log_n[-1] - log_n[0]) - math.log(16.0)) < 0.35
        # centre size at the tokens-per-param prior (20) within a factor ~1.5
        mid = pts[2]
        assert 20 / 2.5 < mid.tokens / mid.n_params_matmul < 20 * 2.5


def test_prior_matches_chinchilla_at_large_scale():
    # big models: flops/token -> 6N, so N* -> sqrt(C / (6 * 20)) (Chinchilla's D = 20N)
    fam = FamilyConfig(head_dim=64, aspect_ratio=64, max_layers=64, max_d_model=16384)
    base = {"vocab_size": 32000, "max_seq_len": 256}
    c = 1e21
    n_star = optimal_size_prior(c, 20.0, fam, base)
    assert abs(math.log(n_star / math.sqrt(c / 120))) < 0.1


def test_shape_rule_respects_head_dim_and_aspect():
    cfg = shape_for(3e5, FAMILY, BASE)
    assert cfg.head_dim == 16 and cfg.d_model % 16 == 0
    assert abs(math.log(cfg.n_params_matmul() / 3e5)) < 0.15
    assert 0.25 < (cfg.d_model / cfg.n_layers) / 32 < 4


def test_lr_rule_and_warmup():
    plan = _plan(lr=1e-3, lr_rule="inverse_width", base_width=128)
    for p in plan.points:
        assert p.lr == pytest.approx(1e-3 * 128 / p.d_model)
        assert 0 <= p.warmup_steps <= 0.1 * p.steps  # warmup capped at 10 % of steps
        # ~N tokens unless capped
        assert p.warmup_steps == min(math.ceil(p.n_params_matmul / TPS), int(0.1 * p.steps))
    fixed = _plan(lr=5e-4, lr_rule="fixed")
    assert {p.lr for p in fixed.points} == {5e-4}


def test_hashes_are_stable_and_distinct():
    a, b = _plan(), _plan()
    assert [p.point_id for p in a.points] == [p.point_id for p in b.points]
    assert len({p.point_id for p in a.points}) == len(a.points)
    # adding a budget keeps the existing points' ids (so a rerun reuses them)
    c = _plan(budgets=[1e12, 3e12, 1e13, 3e13])
    assert {p.point_id for p in a.points} <= {p.point_id for p in c.points}
    # the base config enters the hash
    d = make_plan(a.spec, FAMILY, BASE, TPS, identity={"data": "other"})
    assert not {p.point_id for p in a.points} & {p.point_id for p in d.points}


def test_variants_get_their_own_curves():
    plan = _plan(variants={"mlp": ["gelu", "swiglu"], "model.norm_position": ["pre"]},
                 budgets=[3e12, 1e13])
    assert plan.variants == ["mlp=gelu,norm_position=pre", "mlp=swiglu,norm_position=pre"]
    assert len(plan.points) == 2 * 2 * 5
    swi = [p for p in plan.points if "swiglu" in p.variant]
    assert all(p.model_overrides["mlp"] == "swiglu" for p in swi)
    for p in swi:  # accounting uses the variant's own ModelConfig (SwiGLU's d_ff rule)
        cfg = ModelConfig.from_dict(BASE | p.model_overrides)
        assert p.n_params_matmul == cfg.n_params_matmul()
    assert variant_grid({}) == [("default", {})]


def test_grid_mode():
    spec = SweepSpec(mode="grid", grid_params=[5e4, 2e5], grid_tokens=[1e6, 4e6])
    plan = make_plan(spec, FAMILY, BASE, TPS)
    assert len(plan.points) == 4
    assert sorted({p.tokens for p in plan.points}) == [round(1e6 / TPS) * TPS,
                                                       round(4e6 / TPS) * TPS]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"budgets": [1e8]}, "too small"),  # too few steps/tokens for the smallest model
        ({"budgets": [1e12], "sizes_per_budget": 3, "size_span": 1e4}, "too small"),
        ({"budgets": []}, "sweep.budgets is empty"),
        ({"budgets": [-1.0]}, "non-positive"),
        ({"budgets": [1e12], "sizes_per_budget": 9, "size_span": 1.2}, "repeated shapes"),
        ({"mode": "nope"}, "sweep.mode"),
        ({"lr_rule": "sqrt"}, "sweep.lr_rule"),
        ({"variants": {"model.not_a_field": [1]}}, "not a ModelConfig field"),
        ({"wsd": True, "wsd_decay_fraction": 1.0}, "wsd_decay_fraction"),
        ({"wsd": True, "wsd_fractions": [0.5]}, "including 1.0"),
    ],
)
def test_invalid_plans_fail_with_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        _plan(**kw)


def test_corpus_too_small_unless_repeat_allowed():
    spec = SweepSpec(budgets=[1e13], sizes_per_budget=3, size_span=4.0)
    with pytest.raises(ValueError, match="allow_repeat"):
        make_plan(spec, FAMILY, BASE, TPS, train_tokens=1_000_000)
    spec.allow_repeat = True
    assert make_plan(spec, FAMILY, BASE, TPS, train_tokens=1_000_000).points


# --- the point configs reach the training app unchanged (Hydra compose, no training) ------------
@pytest.mark.slow  # imports Lightning through the train config schema (seconds)
def test_point_config_composes_into_the_train_config(tmp_path):
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec
    from scalelab.scaling.base_run import BaseRun
    from scalelab.scaling.point_config import point_overrides, train_command, write_point_config
    from scalelab.scaling.sweep_settings import RunSettings

    plan = _plan(budgets=[3e12], sizes_per_budget=3, size_span=4.0)
    p = plan.points[1]
    settings = RunSettings(name="t", train_overrides=["model=gpt2_tiny", "model.max_seq_len=128",
                                                      "train.global_batch_size=16",
                                                      "tokenizer=byte"])
    base = BaseRun(cfg=None, model_fields=BASE, tokens_per_step=TPS, micro_batch=16,
                   block_size=128, train_tokens=None, tracking_uri="sqlite:///x.db",
                   artifact_root=None, root=tmp_path, accelerator="cpu")
    ov = point_overrides(p, plan.spec, settings, base, tmp_path, "PARENT", "sweep_t")
    conf = tmp_path / "conf"
    write_point_config(conf / "sweep_point" / f"{p.name}.yaml", p, ov)
    cmd = train_command(settings.train_overrides, [p.name], conf, multirun=True,
                        sweep_dir=tmp_path / "mr")
    assert "--multirun" in cmd and f"+sweep_point={p.name}" in cmd
    assert f"hydra.searchpath=[file://{conf}]" in cmd and "hydra/launcher=basic" in cmd

    cfg = compose("train", [*settings.train_overrides, f"+sweep_point={p.name}",
                            f"hydra.searchpath=[file://{conf}]"])
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == \
        (p.d_model, p.n_layers, p.n_heads)
    assert cfg.optim.lr == pytest.approx(p.lr) and cfg.optim.warmup_steps == p.warmup_steps
    assert cfg.optim.beta2 == 0.99 and cfg.optim.schedule == "cosine"
    assert cfg.logger.parent_run_id == "PARENT" and cfg.logger.experiment_name == "sweep_t"
    assert cfg.tags.sweep_point_id == p.point_id and cfg.tags.sweep_variant == "default"
    assert cfg.paths.output_dir == str(tmp_path / "runs" / p.name)
    spec = build_spec(cfg)  # exactly the validation scalelab-train does
    assert spec.max_steps == p.steps and spec.batch.tokens_per_step == TPS
    assert spec.max_steps * spec.batch.tokens_per_step == p.tokens


def test_cli_routes_overrides():
    from scalelab.cli.sweep import split_overrides

    sw, tr, var, la = split_overrides([
        "sweep=cpu_tiny", "sweep.budgets=[1e10,3e10]", "model.norm=rmsnorm",
        "model.mlp=gelu,swiglu", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
        "+experiment=pystdlib_small"])
    assert sw == ["sweep=cpu_tiny", "sweep.budgets=[1e10,3e10]"]
    assert tr == ["model.norm=rmsnorm", "+experiment=pystdlib_small"]
    assert var == {"model.mlp": ["gelu", "swiglu"]}
    assert la == ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    with pytest.raises(ValueError, match="config group"):
        split_overrides(["model=nano,gpt2_tiny"])
    with pytest.raises(ValueError, match="Quote"):
        split_overrides(["sweep.train_overrides=[a=b]"])


def test_wsd_plan_adds_cooldown_branches_from_stable_phase_checkpoints():
    from scalelab.training.schedules import wsd_decay_start, wsd_schedule

    f = 0.2
    plain = _plan()
    plan = _plan(wsd=True, wsd_fractions=[0.25, 0.5, 1.0], wsd_decay_fraction=f)
    mains = [p for p in plan.points if p.branch_of is None]
    branches = [p for p in plan.points if p.branch_of is not None]
    assert len(mains) == 15 and len(branches) == 30
    assert [(m.tokens, m.n_params) for m in mains] == [(p.tokens, p.n_params) for p in plain.points]
    by_id = {m.point_id: m for m in mains}
    assert len({p.point_id for p in plan.points}) == 45
    for b in branches:
        m = by_id[b.branch_of]
        assert b.branch_from == m.name and b.schedule == m.schedule == "wsd"
        assert b.decay_fraction == f and b.warmup_steps == m.warmup_steps and b.lr == m.lr
        q = b.steps / m.steps
        assert min(abs(q - 0.25), abs(q - 0.5)) < 0.02
        assert b.budget == pytest.approx(m.budget * round(q * 4) / 4)
        assert b.tokens == b.steps * TPS  # D counts the inherited prefix
        # the branch starts where its own decay starts, inside the main run's stable phase ...
        assert b.start_step == wsd_decay_start(b.steps, f, b.warmup_steps) in m.save_at_steps
        assert b.start_step < wsd_decay_start(m.steps, f, m.warmup_steps)
        # ... the same rule the schedule uses, so both lr histories agree up to there
        main_lr = wsd_schedule(m.steps, m.warmup_steps, 0.1, f)
        branch_lr = wsd_schedule(b.steps, b.warmup_steps, 0.1, f)
        assert [branch_lr(s) for s in range(b.start_step)] == [main_lr(s) for s in range(b.start_step)]
        assert branch_lr(b.start_step - 1) == 1.0 and branch_lr(b.start_step) == 1.0
        assert b.cost == b.flops_per_token * (b.steps - b.start_step) * TPS
    for m in mains:
        assert len(m.save_at_steps) == 2
        assert m.optim_overrides(0.1, 0.99)["optim.schedule"] == "wsd"
    # one run per size yields 3 loss points for ~1 + f * (0.25 + 0.5) = 1.15x its cost
    ratio = plan.total_compute / plan.main_compute
    assert ratio == pytest.approx(1 + f * 0.75, abs=0.01)
    assert plan.main_compute == plain.total_compute
    rows = plan.rows()
    assert sum(1 for r in rows if r["wsd_branch_of"]) == 30


def test_wsd_off_keeps_the_cosine_point_hashes():
    a, b = _plan(), _plan(wsd=False, wsd_fractions=[0.5, 1.0])
    assert [p.point_id for p in a.points] == [p.point_id for p in b.points]
    assert all(p.schedule == "cosine" and not p.save_at_steps for p in a.points)


def test_wsd_point_configs_compose_into_main_and_branch_runs(tmp_path):
    from scalelab.config.compose import compose
    from scalelab.scaling.base_run import BaseRun
    from scalelab.scaling.point_config import point_overrides, write_point_config
    from scalelab.scaling.sweep_settings import RunSettings

    plan = _plan(budgets=[3e12], sizes_per_budget=3, size_span=4.0, wsd=True,
                 wsd_fractions=[0.5, 1.0])
    main, branch = plan.points[1], next(p for p in plan.points if p.branch_of == plan.points[1].point_id)
    settings = RunSettings(name="t", train_overrides=["model=gpt2_tiny", "model.max_seq_len=128",
                                                      "train.global_batch_size=16", "tokenizer=byte"])
    base = BaseRun(cfg=None, model_fields=BASE, tokens_per_step=TPS, micro_batch=16,
                   block_size=128, train_tokens=None, tracking_uri="sqlite:///x.db",
                   artifact_root=None, root=tmp_path, accelerator="cpu")
    conf = tmp_path / "conf"
    for p in (main, branch):
        ov = point_overrides(p, plan.spec, settings, base, tmp_path, "PARENT", "sweep_t")
        write_point_config(conf / "sweep_point" / f"{p.name}.yaml", p, ov)
    cm, cb = (compose("train", [*settings.train_overrides, f"+sweep_point={p.name}",
                                f"hydra.searchpath=[file://{conf}]"]) for p in (main, branch))
    assert cm.optim.schedule == cb.optim.schedule == "wsd"
    assert cm.optim.decay_fraction == cb.optim.decay_fraction == plan.spec.wsd_decay_fraction
    assert cm.optim.warmup_steps == cb.optim.warmup_steps == main.warmup_steps
    assert list(cm.train.save_at_steps) == [branch.start_step] and cm.train.init_from is None
    assert cb.train.init_from == str(tmp_path / "runs" / main.name / "checkpoints"
                                     / f"step_{branch.start_step}.ckpt")
    assert cb.train.max_steps == branch.steps and cb.tags.wsd_branch_of == main.point_id
    assert cb.paths.output_dir == str(tmp_path / "runs" / branch.name)


def test_mup_sweep_refuses_the_inverse_width_rule_and_keeps_one_lr_with_fixed():
    mup = {"parametrization": "mup", "mup_base_width": 32}
    spec = SweepSpec(budgets=[1e12, 3e12], sizes_per_budget=4, size_span=16.0)
    with pytest.raises(ValueError, match=r"set sweep\.lr_rule=fixed"):
        make_plan(spec, FAMILY, BASE | mup, TPS)
    fixed = SweepSpec(budgets=[1e12, 3e12], sizes_per_budget=4, size_span=16.0,
                      lr_rule="fixed", lr=3e-3)
    plan = make_plan(fixed, FAMILY, BASE | mup, TPS)
    assert {p.lr for p in plan.points} == {3e-3}  # µP scales the hidden matrices per width
    assert len({p.d_model for p in plan.points}) > 1
    for p in plan.points:
        assert ModelConfig.from_dict(BASE | mup | p.model_overrides).width_multiplier == \
            p.d_model / 32


def test_mup_points_keep_the_family_head_dim_attention_scale_through_the_run_config(tmp_path):
    """The family fixes head_dim and adds heads: µP's attention scale must stay 1/sqrt(head_dim)
    at every width, whether mup comes from the base overrides or from a variant, and the point's
    composed training config must build that model."""
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec
    from scalelab.scaling.base_run import BaseRun
    from scalelab.scaling.point_config import point_overrides, write_point_config
    from scalelab.scaling.sweep_settings import RunSettings

    mup = {"parametrization": "mup", "mup_base_width": 32}
    kw = {"budgets": [1e12, 3e12], "sizes_per_budget": 4, "size_span": 16.0, "lr_rule": "fixed",
          "lr": 3e-3}
    variant = {"variants": {f"model.{k}": [v] for k, v in mup.items()}}
    for plan, base in ((make_plan(SweepSpec(**kw), FAMILY, BASE | mup, TPS), BASE | mup),
                       (make_plan(SweepSpec(**kw | variant), FAMILY, BASE, TPS), BASE)):
        assert len({p.n_heads for p in plan.points}) > 1
        for p in plan.points:
            cfg = ModelConfig.from_dict(base | p.model_overrides)
            assert cfg.head_dim == 16 and cfg.attn_score_scale == pytest.approx(0.25)
    p = plan.points[-1]
    settings = RunSettings(name="t", train_overrides=[
        "model=gpt2_tiny", "model.max_seq_len=128", "train.global_batch_size=16", "tokenizer=byte"])
    run = BaseRun(cfg=None, model_fields=BASE, tokens_per_step=TPS, micro_batch=16,
                  block_size=128, train_tokens=None, tracking_uri="sqlite:///x.db",
                  artifact_root=None, root=tmp_path, accelerator="cpu")
    ov = point_overrides(p, plan.spec, settings, run, tmp_path, "PARENT", "sweep_t")
    write_point_config(tmp_path / "conf" / "sweep_point" / f"{p.name}.yaml", p, ov)
    model = build_spec(compose("train", [*settings.train_overrides, f"+sweep_point={p.name}",
                                         f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])).model
    assert model.parametrization == "mup" and model.d_model == p.d_model > 32
    assert model.attn_score_scale == pytest.approx(0.25)


def test_base_model_fields_at_their_defaults_keep_the_point_hashes():
    """A field added to ModelConfig later, at a default that keeps the old model, must not
    retrain a finished sweep: defaults stay out of a point's id; a changed value does not."""
    spec = SweepSpec(budgets=[1e12], sizes_per_budget=3, size_span=4.0)
    ids = [p.point_id for p in make_plan(spec, FAMILY, BASE, TPS).points]
    at_defaults = BASE | {"mup_base_head_dim": None, "parametrization": "standard", "dropout": 0.0}
    assert [p.point_id for p in make_plan(spec, FAMILY, at_defaults, TPS).points] == ids
    changed = BASE | {"dropout": 0.1}
    assert not set(p.point_id for p in make_plan(spec, FAMILY, changed, TPS).points) & set(ids)
