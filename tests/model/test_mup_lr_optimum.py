"""scripts/mup_lr_transfer.py's estimate of where the best lr lies between grid points."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

_SPEC = importlib.util.spec_from_file_location(
    "mup_lr_transfer", Path(__file__).resolve().parents[2] / "scripts" / "mup_lr_transfer.py")
mup_lr_transfer = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(mup_lr_transfer)


def _grid(vertex: float, noise: float, seeds: int) -> dict[float, list[float]]:
    rng = np.random.default_rng(1)
    return {2.0**k: [2.0 + 0.05 * (k - vertex) ** 2 + float(rng.normal(0, noise))
                     for _ in range(seeds)] for k in range(-9, -3)}


def test_the_vertex_lies_between_grid_points_and_its_interval_covers_it():
    out = mup_lr_transfer.optimum_interval(_grid(-6.3, 0.002, 5))
    assert out["optimum_log2_lr"] == pytest.approx(-6.3, abs=0.05)
    assert out["optimum_log2_lo"] < -6.3 < out["optimum_log2_hi"]
    assert out["optimum_log2_hi"] - out["optimum_log2_lo"] < 0.3
    noisy = mup_lr_transfer.optimum_interval(_grid(-6.3, 0.03, 5))
    assert noisy["optimum_log2_hi"] - noisy["optimum_log2_lo"] > out["optimum_log2_hi"] - out["optimum_log2_lo"]


def test_a_diverged_seed_and_the_grids_edge_give_grid_points_not_nonsense():
    by_lr = _grid(-6.3, 0.002, 3)
    by_lr[2.0**-5][0] = math.nan  # one seed diverged at the best point's neighbour
    out = mup_lr_transfer.optimum_interval(by_lr)
    assert -7 <= out["optimum_log2_lr"] <= -5 and out["optimum_log2_lo"] <= out["optimum_log2_hi"]
    edge = mup_lr_transfer.optimum_interval(_grid(-12.0, 0.0, 2))
    assert edge["optimum_log2_lr"] == -9.0  # the optimum is beyond the grid: its edge is said
    one = mup_lr_transfer.optimum_interval(_grid(-6.3, 0.0, 1))
    assert math.isnan(one["optimum_log2_lo"])  # one seed: no interval
