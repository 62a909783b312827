"""End to end: a WSD sweep (sweep.wsd=true) through the real `scalelab-sweep` CLI.

One budget x 3 sizes, branches at D/2: 3 main runs save a stable-phase checkpoint, then 3
cooldown branches start from it as NEW child runs of the same parent. A rerun trains nothing.
(The full cpu_tiny WSD sweep, 2 budgets x 3 sizes x 3 fractions = 18 runs, takes ~110 s on
2 cores; this smaller one keeps the same structure.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tests.conftest import sqlite_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARGS = ["sweep=cpu_tiny", "sweep.name=tiny_wsd", "sweep.budgets=[1e10]", "sweep.wsd=true",
        "sweep.wsd_fractions=[0.5,1.0]", "sweep.val_evals=2", "sweep.fit=false"]


def test_wsd_sweep_trains_branches_from_main_run_checkpoints(tmp_path: Path) -> None:
    e = dict(os.environ, SCALELAB_ROOT=str(tmp_path), PYTHONUNBUFFERED="1",
             MLFLOW_TRACKING_URI=sqlite_store(tmp_path / "mlruns.db"))

    def sweep() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *ARGS], env=e,
                              cwd=REPO, capture_output=True, text=True, timeout=600)

    first = sweep()
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "6 trained now" in first.stdout and "1.10x the main runs" in first.stdout
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("sweep_tiny_wsd")
    runs = client.search_runs([exp.experiment_id])
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(kids) == 6 and {k.info.status for k in kids} == {"FINISHED"}
    by_point = {k.data.tags["sweep_point_id"]: k for k in kids}
    branches = [k for k in kids if k.data.tags.get("wsd_branch_of")]
    assert len(branches) == 3
    sweep_dir = tmp_path / "sweeps" / "tiny_wsd"
    for b in branches:
        main = by_point[b.data.tags["wsd_branch_of"]]
        start = int(b.data.tags["wsd_start_step"])
        main_name = main.data.tags["sweep_point"]
        assert (sweep_dir / "runs" / main_name / "checkpoints" / f"step_{start}.ckpt").is_file()
        assert b.info.run_id != main.info.run_id
        steps = float(b.data.tags["final.steps"])
        assert 0 < start < steps < float(main.data.tags["final.steps"])
        assert float(b.data.tags["final.tokens_seen"]) == steps * 2048  # includes the inherited prefix
        val_steps = [m.step for m in client.get_metric_history(b.info.run_id, "val/loss")]
        assert val_steps and min(val_steps) > start  # the branch logs only its own steps
        assert float(b.data.tags["sweep_budget"]) == pytest.approx(
            float(main.data.tags["sweep_budget"]) / 2)
    runs_csv = (sweep_dir / "runs.csv").read_text()
    assert "wsd_branch_of" in runs_csv.splitlines()[0]

    second = sweep()
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "skipping 6 point(s)" in second.stdout and "nothing to train" in second.stdout
