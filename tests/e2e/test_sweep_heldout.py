"""End to end: a sweep reopened with another held-out set scores every finished point again
(nothing retrains), and one reopened with none fits on the points' own validation losses, never
on scores from a set it no longer uses. Real `scalelab-sweep` processes, a real SQLite store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from tests.conftest import sqlite_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARGS = ["sweep=cpu_tiny", "sweep.budgets=[1e10]", "sweep.sizes_per_budget=2", "sweep.val_evals=1",
        "sweep.fit=false"]


def _sweep(env: dict[str, str], heldout_tokens: int) -> str:
    p = subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *ARGS,
                        f"sweep.heldout_tokens={heldout_tokens}"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def _children(env: dict[str, str]) -> tuple[dict[str, str], list]:
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("sweep_cpu_tiny")
    runs = client.search_runs([exp.experiment_id], "", run_view_type=ViewType.ACTIVE_ONLY)
    parent = next(r for r in runs if r.data.tags.get("scalelab.sweep_role") == "parent")
    return parent.data.tags, [r for r in runs if r.data.tags.get("mlflow.parentRunId")
                              == parent.info.run_id]


def test_a_changed_heldout_set_rescores_and_no_set_falls_back(tmp_path):
    env = dict(os.environ, SCALELAB_ROOT=str(tmp_path), PYTHONUNBUFFERED="1",
               MLFLOW_TRACKING_URI=sqlite_store(tmp_path / "mlruns.db"))
    runs_csv = tmp_path / "sweeps" / "cpu_tiny" / "runs.csv"

    _sweep(env, 4096)
    tags, kids = _children(env)
    first = {k.info.run_id: k.data.metrics["final/heldout_loss"] for k in kids}
    assert len(first) == 2 and {k.data.metrics["final/heldout_tokens"] for k in kids} == {4096}
    assert {k.data.tags["heldout_set"] for k in kids} == {tags["heldout_set"]}

    out = _sweep(env, 8192)
    assert out.count("scored again: the held-out set changed") == 2, out[-3000:]
    tags2, kids = _children(env)
    assert {k.info.run_id for k in kids} == set(first)  # scored again, not trained again
    assert tags2["heldout_set"] != tags["heldout_set"]
    assert {k.data.tags["heldout_set"] for k in kids} == {tags2["heldout_set"]}
    assert {k.data.metrics["final/heldout_tokens"] for k in kids} == {8192}
    assert all(k.data.metrics["final/heldout_loss"] != first[k.info.run_id] for k in kids)
    table = pd.read_csv(runs_csv)
    assert set(table["loss_source"]) == {"final/heldout_loss"}
    assert set(table["heldout_tokens"]) == {8192}

    out = _sweep(env, 0)  # no set now: the old scores must not count
    assert "scored again" not in out
    tags3, kids = _children(env)
    assert tags3["heldout_set"] == "none" and {k.info.run_id for k in kids} == set(first)
    table = pd.read_csv(runs_csv)
    assert set(table["loss_source"]) == {"final/val_loss"}
    assert table["heldout_tokens"].isna().all() and table["loss_se"].isna().all()
