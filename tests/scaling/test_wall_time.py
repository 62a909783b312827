"""The points' wall-time estimate fitted to the tune runs' wall times (scaling/wall_time.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from scalelab.scaling.wall_time import fit_run_times


def _runs(n: int, per_run: float, per_step: float, per_flop: float, noise: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    steps = rng.integers(50, 5000, n).astype(float)
    flops = steps * rng.uniform(1e6, 5e7, n)  # sizes differ: FLOPs per step are not one constant
    wall = per_run + per_step * steps + per_flop * flops
    return pd.DataFrame({"steps": steps, "flops": flops,
                         "wall_s": wall * (1 + noise * rng.standard_normal(n)), "loss": 3.0})


def test_the_three_costs_are_recovered_and_applied_to_a_point() -> None:
    model = fit_run_times(_runs(30, per_run=3.0, per_step=0.012, per_flop=2e-10))
    assert model is not None and model.n_runs == 30
    assert model.per_run_s == pytest.approx(3.0, rel=1e-6)
    assert model.per_step_s == pytest.approx(0.012, rel=1e-6)
    assert model.per_flop_s == pytest.approx(2e-10, rel=1e-6)
    point = SimpleNamespace(steps=1000, start_step=0, cost=4e10)
    assert model.seconds(point) == pytest.approx(3.0 + 12.0 + 8.0)
    branch = SimpleNamespace(steps=1000, start_step=600, cost=1.6e10)  # a WSD branch: 400 steps
    assert model.seconds(branch) == pytest.approx(3.0 + 4.8 + 3.2)
    assert "30 tune runs" in model.describe() and "12.00 ms per step" in model.describe()


def test_noisy_runs_give_a_close_non_negative_model() -> None:
    model = fit_run_times(_runs(40, per_run=2.0, per_step=0.02, per_flop=1e-10, noise=0.05))
    assert model is not None
    assert min(model.per_run_s, model.per_step_s, model.per_flop_s) >= 0.0
    assert model.per_step_s == pytest.approx(0.02, rel=0.2)


def test_too_few_or_unusable_runs_give_no_model() -> None:
    assert fit_run_times(_runs(3, 1.0, 0.01, 1e-10)) is None
    assert fit_run_times(_runs(10, 1.0, 0.01, 1e-10).drop(columns="wall_s")) is None
    unfinished = _runs(10, 1.0, 0.01, 1e-10).assign(wall_s=np.nan)
    assert fit_run_times(unfinished) is None


def test_points_launch_longest_first_and_keep_plan_order_without_estimates() -> None:
    from scalelab.scaling.launch import launch_order

    points = [SimpleNamespace(name=n) for n in ("a", "b", "c", "d")]
    order = launch_order(points, {"a": 5.0, "b": 90.0, "c": 5.0, "d": 30.0})  # type: ignore[arg-type]
    assert [p.name for p in order] == ["b", "d", "a", "c"]
    assert [p.name for p in launch_order(points, {})] == ["a", "b", "c", "d"]  # type: ignore[arg-type]


def _small_plan():
    from scalelab.scaling.planner import make_plan
    from scalelab.scaling.sweep_spec import FamilyConfig, SweepSpec

    spec = SweepSpec(budgets=[2e9], sizes_per_budget=2, size_span=4.0)
    family = FamilyConfig(head_dim=8, aspect_ratio=16, max_layers=2)
    return make_plan(spec, family, {"vocab_size": 64, "max_seq_len": 32}, 4 * 32,
                     train_tokens=10_000_000)


def test_scoring_time_is_measured_per_shape_with_the_threads_asked() -> None:
    import torch

    from scalelab.scaling.heldout import measure_seconds_per_window

    plan = _small_plan()
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        per_window = measure_seconds_per_window(plan, threads=1)
        assert torch.get_num_threads() == 2  # the caller's threads are given back
    finally:
        torch.set_num_threads(old)
    shapes = {(p.n_layers, p.d_model, p.variant) for p in plan.points}
    assert set(per_window) == shapes and len(shapes) == 2
    assert all(0 < s < 1 for s in per_window.values())  # one 32-token window, a tiny model


def test_scoring_time_scales_to_the_windows_the_held_out_set_really_has() -> None:
    from scalelab.scaling.heldout import HeldoutSet, score_seconds, window_count

    tokens = np.arange(100_000) % 64
    for n_tokens in (10, 64, 1000, 32 * 48 + 31, 50_000):
        real = HeldoutSet.from_tokens(tokens, 32, n_tokens).windows.shape[0]
        assert window_count(n_tokens, 32) == real
        assert score_seconds({(2, 16, ""): 0.5}, n_tokens, 32) == {(2, 16, ""): 0.5 * real}


def test_scoring_time_counts_one_window_per_choice_of_each_task_item() -> None:
    from scalelab.scaling.heldout import score_seconds, window_count
    from scalelab.scaling.task_metric import ContinuationTask

    tokens = (np.arange(20_000) * 7919 % 97).astype(np.int64)
    tokens[::41] = 0  # the newline token: lines of 40 tokens
    task = ContinuationTask.from_tokens(tokens, 0, 32, 50, 8)
    windows = task.sequences.reshape(-1, task.sequences.shape[-1])
    assert windows.shape == (4 * task.n_items, 33)  # what ending_logprobs runs the model on
    assert score_seconds({(2, 16, ""): 0.5}, 0, 32, task.n_items) == {
        (2, 16, ""): 0.5 * len(windows)}
    both = score_seconds({(2, 16, ""): 0.5}, 6400, 32, task.n_items)[(2, 16, "")]
    assert both == pytest.approx(0.5 * (window_count(6400, 32) + len(windows)))


def test_the_estimate_adds_each_points_scoring_time() -> None:
    from scalelab.scaling.wall_time import estimate_seconds

    plan = _small_plan()
    keys = {(p.n_layers, p.d_model, p.variant) for p in plan.points}
    fps = dict.fromkeys(keys, 1e9)
    score = {k: 10.0 * (i + 1) for i, k in enumerate(sorted(keys))}
    plain = estimate_seconds(plan, fps, overhead_s=2.0)
    scored = estimate_seconds(plan, fps, 2.0, score)
    for p, a, b in zip(plan.points, plain, scored, strict=True):
        assert a == pytest.approx(p.cost / 1e9 + 2.0)
        assert b - a == pytest.approx(score[(p.n_layers, p.d_model, p.variant)])
