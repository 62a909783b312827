"""End to end: a real sweep whose forecast stage trains the runs it forecast, against a real
MLflow (SQLite) store, with the line-ending task scored and forecast too; a rerun trains
nothing."""

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

from scalelab.scaling.collect import FINAL_LOSS_KEYS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARGS = ["sweep=cpu_tiny", "sweep.name=tiny_forecast", "sweep.budgets=[3e9,6e9,1.2e10]",
        "sweep.forecast_multiples=[2]", "sweep.forecast_lr_factors=[0.5,1]", "sweep.val_evals=1",
        "sweep.bootstrap=10", "sweep.task_items=200"]


def _sweep(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *ARGS], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)


def test_forecast_stage_trains_its_runs_and_scores_them(tmp_path):
    env = dict(os.environ, SCALELAB_ROOT=str(tmp_path), PYTHONUNBUFFERED="1",
               MLFLOW_TRACKING_URI=sqlite_store(tmp_path / "mlruns.db"))
    first = _sweep(env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "then a forecast at 2x (C = 2.4e+10)" in first.stdout  # the plan says it comes
    assert "forecast stage: training 4 runs" in first.stdout
    sweep_dir = tmp_path / "sweeps" / "tiny_forecast"
    table = pd.read_csv(sweep_dir / "report" / "forecast.csv")
    assert list(table.columns) == ["budget_multiple", "budget", "N_star", "D_star", "loss_pred",
                                   "loss_lo", "loss_hi", "loss_actual"]
    assert table["budget"].tolist() == [2.4e10] and table["loss_actual"].notna().all()
    row = table.iloc[0]
    assert row.loss_lo < row.loss_pred < row.loss_hi
    report = (sweep_dir / "report" / "report.md").read_text()
    assert report.startswith("# Scaling-law report\n\n## Answer\n")  # then the forecast section
    assert "**Forecast at 2x** (C = 2.4e+10 FLOPs)" in report.split("## Forecast vs outcome")[0]
    assert (sweep_dir / "report" / "forecast.png").is_file()
    # the study's fit and runs.csv hold the study's points only, each scored on the task
    study = pd.read_csv(sweep_dir / "runs.csv")
    assert len(study) == 9 and study["task_acc"].between(0, 1).all()
    assert (study["task_loss"] > 0).all()
    assert "task forecast: task loss = " in first.stdout
    assert "### Task accuracy: a two-step forecast" in report
    task_rows = pd.read_csv(sweep_dir / "report" / "forecast_runs.csv").query("role != 'grid'")
    assert task_rows["task_acc_pred"].notna().all() and task_rows["task_acc_actual"].notna().all()

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("sweep_tiny_forecast")
    runs = client.search_runs([exp.experiment_id], "", run_view_type=ViewType.ACTIVE_ONLY)
    forecast = [r for r in runs if r.data.tags.get("sweep_stage") == "forecast"]
    assert sorted(r.data.tags["forecast_role"] for r in forecast) == [
        "grid", "larger", "optimum", "smaller"]
    assert {r.info.status for r in forecast} == {"FINISHED"}
    parent = next(r for r in runs if r.data.tags.get("scalelab.sweep_role") == "parent")
    for r in forecast:
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        if r.data.tags["forecast_role"] == "grid":  # no loss forecast: not the laws' lr
            assert "forecast_loss_pred" not in r.data.tags
            continue
        pred = float(r.data.tags["forecast_loss_pred"])  # tagged before it trained
        lo, hi = float(r.data.tags["forecast_loss_lo"]), float(r.data.tags["forecast_loss_hi"])
        actual = next(r.data.metrics[k] for k in FINAL_LOSS_KEYS if k in r.data.metrics)
        assert r.data.metrics["forecast/loss_pred"] == pytest.approx(pred, abs=1e-4)
        assert r.data.metrics["forecast/error"] == pytest.approx(actual / pred - 1, abs=1e-3)
        assert r.data.metrics["forecast/covered"] == float(lo <= actual <= hi)
        acc, acc_lo = r.data.metrics["final/task_acc"], float(r.data.tags["forecast_task_acc_lo"])
        acc_hi = float(r.data.tags["forecast_task_acc_hi"])
        assert acc_lo < float(r.data.tags["forecast_task_acc_pred"]) < acc_hi
        assert r.data.metrics["forecast/task_covered"] == float(acc_lo <= acc <= acc_hi)
    assert parent.data.metrics["forecast/2x/loss_actual"] == pytest.approx(row.loss_actual)

    second = _sweep(env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "nothing to train" in second.stdout
    assert second.stdout.count("nothing to train") == 2  # the study, then the forecast runs
    assert pd.read_csv(sweep_dir / "report" / "forecast.csv").equals(table)
