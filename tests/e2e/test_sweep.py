"""End to end: real `scalelab-sweep` processes against a real MLflow (SQLite) store.

- a cpu_tiny sweep (2 budgets x 3 sizes) leaves one parent and 6 FINISHED children, the fit and
  the report files; running it again trains nothing;
- a point that fails does not stop the others.

A killed sweep and its rerun are tests/e2e/test_sweep_kill.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from tests.conftest import sqlite_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# Smaller than the preset: a little quicker, same structure (2 budgets x 3 sizes).
FAST = ["sweep.val_evals=2", "sweep.bootstrap=10"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep_root")
    e = dict(os.environ)
    e["SCALELAB_ROOT"] = str(root)  # sweeps/, data_cache/, outputs/ land here, not in the repo
    e["MLFLOW_TRACKING_URI"] = sqlite_store(root / "mlruns.db")
    e["PYTHONUNBUFFERED"] = "1"
    return root, e


def _sweep(env, *args: str, **kw) -> subprocess.CompletedProcess:
    _, e = env
    return subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *args], env=e, cwd=REPO,
                          capture_output=True, text=True, timeout=900, **kw)


def _children(uri: str, name: str) -> tuple[str, list]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(f"sweep_{name}")
    runs = client.search_runs([exp.experiment_id], "", run_view_type=ViewType.ACTIVE_ONLY)
    parents = [r for r in runs if r.data.tags.get("scalelab.sweep_role") == "parent"]
    assert len(parents) == 1, f"expected one parent run, got {len(parents)}"
    pid = parents[0].info.run_id
    return pid, [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pid]


def test_cpu_tiny_sweep_then_rerun_trains_nothing(env):
    """With joblib's launcher, two runs at a time, as the cpu_small and cpu_medium presets run."""
    root, e = env
    t0 = time.time()
    first = _sweep(env, "sweep=cpu_tiny", *FAST, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    wall = time.time() - t0
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "6 trained now" in first.stdout
    assert "with launcher=hydra (joblib)" in first.stdout
    pid, kids = _children(e["MLFLOW_TRACKING_URI"], "cpu_tiny")
    assert len(kids) == 6
    assert {k.info.status for k in kids} == {"FINISHED"}
    assert len({k.data.tags["sweep_point_id"] for k in kids}) == 6
    for k in kids:  # every convention is logged with each child
        for key in ("n_params", "n_params_non_embedding", "n_params_matmul", "flops_per_token",
                    "flops_per_token_6n", "compute"):
            assert key in k.data.params
        assert "final.val_loss" in k.data.tags
    sweep_dir = root / "sweeps" / "cpu_tiny"
    for f in ("plan.json", "plan.csv", "runs.csv", "curves.csv", "report/report.md"):
        assert (sweep_dir / f).is_file(), f
    assert list((sweep_dir / "report").glob("*.png"))
    # every point says how many times it read the corpus's train split, and the report says it
    runs = pd.read_csv(sweep_dir / "runs.csv")
    train_tokens = json.loads((sweep_dir / "plan.json").read_text())["train_tokens"]
    assert runs["epochs"].to_numpy() == pytest.approx(runs["D"].to_numpy() / train_tokens)
    assert "- Data: every point trains on fresh tokens" in (sweep_dir / "report/report.md").read_text()
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    arts = {a.path for a in client.list_artifacts(pid)}
    assert {"plan", "data", "report"} <= arts
    parent = client.get_run(pid)
    assert parent.data.params["n_points"] == "6"
    assert any(k.startswith("fit/") for k in parent.data.metrics)
    # Approach 3's own check: one seed, so its rms misfit and no chi2
    assert "Approach 3 form check: rms log residual" in first.stdout
    assert "noise not measured" in first.stdout
    assert parent.data.metrics["fit/approach3_rms_residual"] > 0
    assert "fit/approach3_chi2_per_dof" not in parent.data.metrics
    assert "describe the points?** rms log residual" in (sweep_dir / "report/report.md").read_text()
    print(f"cpu_tiny sweep wall time: {wall:.0f} s")

    second = _sweep(env, "sweep=cpu_tiny", *FAST)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "skipping 6 point(s)" in second.stdout and "nothing to train" in second.stdout
    pid2, kids2 = _children(e["MLFLOW_TRACKING_URI"], "cpu_tiny")
    assert pid2 == pid and len(kids2) == 6


def test_plan_only_and_bad_plans(env):
    ok = _sweep(env, "--plan-only", "sweep=cpu_tiny")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "sweep plan: 6 runs" in ok.stdout and "nothing ran" in ok.stdout
    assert "measured scoring" not in ok.stdout
    scored = _sweep(env, "--plan-only", "sweep=cpu_tiny", "sweep.heldout_tokens=20000",
                    "sweep.task_items=100", "sweep.estimate_time=true")
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert "measured scoring of 5 sizes" in scored.stdout, scored.stdout[-3000:]
    assert "a run on 20,000 held-out tokens and 100 task items" in scored.stdout
    assert "estimated wall time" in scored.stdout
    bad = _sweep(env, "--plan-only", "sweep=cpu_tiny", "sweep.budgets=[1e6]")
    assert bad.returncode == 2
    assert "error:" in bad.stderr and "too small" in bad.stderr
    # a training override of a key each point sets would silently beat the plan's values
    clash = _sweep(env, "--plan-only", "sweep=cpu_tiny", "optim.lr=1e-3")
    assert clash.returncode == 2 and "Traceback" not in clash.stderr
    assert clash.stderr.strip().splitlines() == [clash.stderr.strip()]
    assert "optim.lr=1e-3" in clash.stderr and "sweep.lr" in clash.stderr
    task = _sweep(env, "--plan-only", "sweep=cpu_tiny", "sweep.task_items=-5")
    assert task.returncode == 2 and task.stderr.strip().splitlines() == [task.stderr.strip()]
    assert "sweep.task_items=-5" in task.stderr and "Traceback" not in task.stderr


def test_failing_points_do_not_stop_the_others(env):
    _, e = env
    # weight_decay=-1 passes the planner but fails in the training app (OptimConfig), once per
    # point of that variant; the other variant's points must still train.
    res = _sweep(env, "sweep=cpu_tiny", "sweep.name=tiny_fail", "sweep.budgets=[1e10]",
                 "sweep.sizes_per_budget=2", "sweep.size_span=2.5", "sweep.fit=false",
                 "optim.weight_decay=-1.0,0.1", *FAST)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "2 trained now" in res.stdout and "2 failed" in res.stdout
    assert res.stdout.count("failed C1e10-N") == 2 and "weight_decay" in res.stdout
    _, kids = _children(e["MLFLOW_TRACKING_URI"], "tiny_fail")
    fin = [k for k in kids if k.info.status == "FINISHED"]
    assert len(fin) == 2 and {k.data.tags["sweep_variant"] for k in fin} == {"optim.weight_decay=0.1"}
