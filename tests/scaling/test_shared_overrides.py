"""A sweep's shared training overrides never silently replace what the plan sets per point.

Hydra applies command-line key overrides after the point's config group, so without this check
`scalelab-sweep optim.lr=1e-3` would train every point at 1e-3 while the tune stage's law is
recorded, and `seed=7` would give every replicate seed 7. Real plans, real Hydra composition of
the command the point runs get."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from scalelab.cli.sweep_plan import print_plan
from scalelab.config.compose import compose
from scalelab.scaling.base_run import BaseRun
from scalelab.scaling.planner import make_plan
from scalelab.scaling.point_config import (
    check_point_overrides,
    point_overrides,
    train_command,
    write_point_config,
)
from scalelab.scaling.sweep_settings import RunSettings
from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec

BASE = {"vocab_size": 64, "max_seq_len": 32}
FAMILY = FamilyConfig(head_dim=8, aspect_ratio=16.0, max_layers=4)
PRESET = ["model=gpt2_tiny", "model.max_seq_len=32", "train.global_batch_size=16",
          "tokenizer=byte"]


def _plan(**kw):
    spec = SweepSpec(budgets=[3e10, 1e11], sizes_per_budget=3, size_span=4.0, **kw)
    return make_plan(spec, FAMILY, BASE, tokens_per_step=512)


def _base(tmp_path, overrides):
    cfg = compose("train", overrides)
    return BaseRun(cfg=cfg, model_fields=BASE, tokens_per_step=512, micro_batch=16,
                   block_size=32, train_tokens=None, tracking_uri="sqlite:///x.db",
                   artifact_root=None, root=tmp_path, accelerator="cpu", seed=int(cfg.seed),
                   log_every_n_steps=int(cfg.trainer.log_every_n_steps),
                   precision=str(cfg.trainer.precision))


@pytest.mark.parametrize(("override", "hint"), [
    ("optim.lr=1e-3", "sweep.lr_rule=fixed"),
    ("++optim.lr=1e-3", "sweep.lr_law"),
    ("optim.beta2=0.95", "sweep.tune_beta2s"),
    ("optim.warmup_steps=10", "sweep.warmup_tokens_per_param"),
    ("train.max_steps=100", "sweep.budgets"),
    ("model.d_model=64", "sweep.family"),
    ("logger.experiment_name=mine", "sweep.experiment_name"),
])
def test_an_override_of_a_planned_key_is_refused_with_the_setting_to_use(tmp_path, override,
                                                                           hint):
    plan = _plan()
    settings = RunSettings(name="t", train_overrides=[*PRESET, override])
    base = _base(tmp_path, PRESET)
    with pytest.raises(ValueError) as e:
        check_point_overrides(plan, plan.spec, settings, base)
    msg = str(e.value)
    key = override.lstrip("+").split("=")[0]
    assert msg.startswith(override) and key in msg and hint in msg and "\n" not in msg


def test_overrides_the_plan_does_not_set_or_derives_from_the_base_pass(tmp_path):
    free = ["seed=7", "optim.weight_decay=0.2", "trainer.enable_progress_bar=true",
            "model.dropout=0.1"]
    settings = RunSettings(name="t", train_overrides=[*PRESET, *free])
    plan = _plan()
    check_point_overrides(plan, plan.spec, settings, _base(tmp_path, settings.train_overrides))


def test_a_seed_override_reaches_every_replicate_and_the_batch_stays_the_points(tmp_path):
    overrides = [*PRESET, "seed=7"]
    plan = _plan(seeds=2)
    settings = RunSettings(name="t", train_overrides=overrides)
    base = _base(tmp_path, overrides)
    conf = tmp_path / "conf"
    seeds = {}
    for p in plan.points[:2] + [q for q in plan.points if q.replicate == 1][:1]:
        ov = point_overrides(p, plan.spec, settings, base, tmp_path, "PARENT", "sweep_t")
        write_point_config(conf / "sweep_point" / f"{p.name}.yaml", p, ov)
        cmd = train_command(settings.train_overrides, [p.name], conf, multirun=False)
        assert "seed=7" not in cmd and "train.global_batch_size=16" not in cmd
        cfg = compose("train", cmd[3:])
        seeds[p.replicate] = cfg.seed
        assert cfg.train.global_batch_size * 32 == p.tokens_per_step
    assert seeds == {0: 7, 1: 8}


def _printed(plan) -> str:
    out = io.StringIO()
    print_plan(plan, None, Console(file=out, width=400))
    return out.getvalue()


def test_the_plan_footer_states_the_tuned_values_after_the_tune_stage():
    plan = _plan(tune_lr_factors=[0.5, 1, 2], tune_batch_factors=[0.5, 1, 2],
                 tune_beta2s=[0.95, 0.99])
    before = _printed(plan)
    assert "lr rule inverse_width" in before and "AdamW beta2=0.99" in before
    assert "tune stage first" in before
    tuned = plan.with_hparams({"default": {"lr": {"coef": 0.5, "exponent": -0.3},
                                           "batch": {"coef": 8.0, "exponent": 0.1},
                                           "beta2": 0.95}})
    after = _printed(tuned)
    assert "tuned lr*(N) = 0.5 * N^-0.300" in after and "B*(N) = 8 * N^+0.100" in after
    assert "AdamW beta2 tuned: 0.95" in after
    assert "beta2=0.99" not in after and "lr rule" not in after and "tune stage first" not in after


def test_each_point_logs_about_log_points_rows_never_more_often_than_the_base(tmp_path):
    """Logging a tiny point's every 10th step cost ~15 % of its time (docs/performance.md): the
    cadence follows the point's length, with the trainer's (or the user's) value as the floor,
    and reaches the composed config of the point's run."""
    plan = _plan()
    conf = tmp_path / "conf"
    for overrides, log_points, floor in (([*PRESET], 4, 10), ([*PRESET, "trainer.log_every_n_steps=25"], 2, 25)):
        settings = RunSettings(name="t", train_overrides=overrides, log_points=log_points)
        base = _base(tmp_path, overrides)
        check_point_overrides(plan, plan.spec, settings, base)  # a base-derived key: allowed
        for p in plan.points:
            ov = point_overrides(p, plan.spec, settings, base, tmp_path, "PARENT", "sweep_t")
            want = max(floor, -(-p.steps // log_points))
            assert ov["trainer.log_every_n_steps"] == want
            write_point_config(conf / "sweep_point" / f"{p.name}.yaml", p, ov)
            cmd = train_command(settings.train_overrides, [p.name], conf, multirun=False)
            assert compose("train", cmd[3:]).trainer.log_every_n_steps == want
        assert any(max(floor, -(-p.steps // log_points)) > floor for p in plan.points)
    with pytest.raises(ValueError, match=r"sweep\.log_points=0"):
        RunSettings(name="t", log_points=0)


def test_a_cpu_study_trains_every_point_in_one_precision(tmp_path):
    """trainer.precision=auto (the CPU default) would take bf16 on a native-bf16 CPU for the wide points
    only: every point of a CPU sweep gets fp32 instead; a precision the user chose is kept."""
    plan = _plan()
    for overrides, expected in (([*PRESET], "32-true"),
                                ([*PRESET, "trainer.precision=bf16-mixed"], "bf16-mixed")):
        settings = RunSettings(name="t", train_overrides=overrides)
        base = _base(tmp_path, overrides)
        for p in plan.points:
            ov = point_overrides(p, plan.spec, settings, base, tmp_path, "PARENT", "sweep_t")
            cfg = compose("train", [*overrides, *(f"{k}={v}" for k, v in ov.items()
                                                   if k == "trainer.precision")])
            assert cfg.trainer.precision == expected
    settings = RunSettings(name="t", train_overrides=[*PRESET, "trainer.precision=auto"])
    with pytest.raises(ValueError, match="one precision"):
        check_point_overrides(plan, plan.spec, settings, _base(tmp_path, settings.train_overrides))
