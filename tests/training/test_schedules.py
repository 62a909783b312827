from __future__ import annotations

import itertools
import math

import pytest
import torch

from scalelab.training import OptimConfig, build_lr_lambda
from scalelab.training.schedules import constant_schedule, cosine_schedule, wsd_schedule


def test_cosine_exact_values() -> None:
    f = cosine_schedule(total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert [f(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == 1.0  # warmup reaches the peak on its last step
    assert f(10) == 1.0  # cosine starts at the peak
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert f(109) == 0.1  # exactly min lr on the last step (no float slop)
    values = [f(s) for s in range(10, 110)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_cosine_without_warmup_starts_at_peak() -> None:
    f = cosine_schedule(5, 0, 0.0)
    assert [f(s) for s in range(5)] == pytest.approx([1.0, 0.8535534, 0.5, 0.1464466, 0.0])


def test_wsd_phases() -> None:
    f = wsd_schedule(total_steps=100, warmup_steps=10, min_lr_ratio=0.0, decay_fraction=0.2)
    assert f(0) == pytest.approx(0.1)
    assert all(f(s) == 1.0 for s in range(9, 81))  # stable through the start of the decay
    assert f(80) == 1.0 and f(81) < 1.0  # decay starts at step 100 - 20
    assert f(90) == pytest.approx(1 - 10 / 19)  # linear over steps 80..99
    assert f(99) == 0.0


def test_wsd_shapes_and_min_lr() -> None:
    for shape in ("linear", "cosine", "sqrt"):
        f = wsd_schedule(50, 5, 0.1, 0.4, shape)
        assert f(29) == 1.0 and f(30) == 1.0 and f(49) == pytest.approx(0.1)
    g = wsd_schedule(50, 5, 0.1, 0.4, "cosine")
    assert g(39) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 9 / 19)))


def test_constant() -> None:
    f = constant_schedule(4)
    assert [f(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert constant_schedule(0)(0) == 1.0


def test_build_from_config_and_lambdalr_steps() -> None:
    cfg = OptimConfig(lr=1e-3, schedule="cosine", warmup_steps=2, min_lr_ratio=0.1)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, build_lr_lambda(cfg, total_steps=10))
    lrs = []
    for _ in range(10):  # the lr each optimizer update uses
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4)


def test_errors() -> None:
    with pytest.raises(ValueError, match="total_steps=0"):
        build_lr_lambda(OptimConfig(), 0)
    # a warmup as long as the run is capped (resolve_warmup), so short runs of any preset work
    assert build_lr_lambda(OptimConfig(warmup_steps=10), 10)(0) == pytest.approx(1.0)
    # constant: a warmup longer than the run is allowed (nothing to end exactly)
    assert build_lr_lambda(OptimConfig(schedule="constant", warmup_steps=10), 5)(0) == 0.1


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_branch_shares_the_main_runs_lr_history_up_to_its_start(shape: str) -> None:
    # sweep.wsd: a branch of S_b steps starts from the main run's checkpoint at the step where
    # its own decay begins; up to there both schedules (same warmup, same stable lr) agree.
    total, f, warm = 400, 0.2, 12
    main = wsd_schedule(total, warm, 0.1, f, shape)
    for q in (0.25, 0.5):
        s_b = round(total * q)
        branch = wsd_schedule(s_b, warm, 0.1, f, shape)
        start = s_b - round(f * s_b)  # where the branch's decay starts (= its save step)
        assert start < total - round(f * total)  # still in the main run's stable phase
        assert [branch(s) for s in range(start)] == [main(s) for s in range(start)]
        assert branch(start) == 1.0 and branch(s_b - 1) == pytest.approx(0.1)


def test_resumed_curves() -> None:
    """A 60-step cosine run extended to 100 steps: continue holds the final lr, restart warms
    up again over the 40 added steps, replan stretches the curve (never silently)."""
    from scalelab.training.schedules import extended_segments, segmented_lr_lambda

    cfg = OptimConfig(warmup_steps=5, min_lr_ratio=0.1)
    old = build_lr_lambda(cfg, 60)
    cont = segmented_lr_lambda(cfg, extended_segments([(0, 60)], 100, "continue"))
    assert [cont(s) for s in (0, 30, 59)] == [old(s) for s in (0, 30, 59)]
    assert cont(59) == cont(80) == pytest.approx(0.1)
    restart = segmented_lr_lambda(cfg, extended_segments([(0, 60)], 100, "restart"))
    assert restart(59) == pytest.approx(0.1) and restart(60) == pytest.approx(1 / 5)
    assert restart(65) == pytest.approx(1.0) and restart(99) == pytest.approx(0.1)
    replan = segmented_lr_lambda(cfg, extended_segments([(0, 60)], 100, "replan"))
    assert replan(99) == pytest.approx(0.1) and replan(59) > 0.3
    with pytest.raises(ValueError, match=r"train\.resume_schedule=None"):
        extended_segments([(0, 60)], 100, None)
