"""End to end: a cpu_tiny sweep with the tune stage (lr, batch and beta2 rounds), seed replicates
and the fixed held-out set, through a real `scalelab-sweep` process and a real MLflow (SQLite)
store. Kept lean: one budget (3e9: short runs, since each round is a launch of its own), 2 sizes
x 2 seeds after a 2-size x 3-lr grid, a 2-size x 3-batch grid and a 2-size x 2-beta2 grid (20
tiny runs, one after another: the basic launcher starts one process a round, where joblib's
would start two more and the sweep would take 65 % more CPU; test_sweep.py runs a sweep with
joblib)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from tests.conftest import sqlite_store

from scalelab.scaling.plan import round_batch

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_tune_stage_seeds_and_heldout(tmp_path):
    e = dict(os.environ, SCALELAB_ROOT=str(tmp_path), PYTHONUNBUFFERED="1",
             MLFLOW_TRACKING_URI=sqlite_store(tmp_path / "mlruns.db"))
    args = ["sweep=cpu_tiny", "sweep.budgets=[3e9]", "sweep.sizes_per_budget=2",
            "sweep.tune_lr_factors=[0.5,1,2]", "sweep.tune_sizes=2", "sweep.seeds=2",
            "sweep.tune_batch_factors=[0.5,1,2]", "sweep.tune_beta2s=[0.95,0.999]",
            "sweep.heldout_tokens=8192", "sweep.val_evals=1", "sweep.fit=false",
            "hydra/launcher=basic"]
    p = subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *args], env=e, cwd=REPO,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "tune stage: lr*(N) =" in p.stdout and "tune stage: B*(N) =" in p.stdout
    assert "tune stage: beta2 = " in p.stdout

    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("sweep_cpu_tiny")
    runs = client.search_runs([exp.experiment_id], "", run_view_type=ViewType.ACTIVE_ONLY)
    parent = next(r for r in runs if r.data.tags.get("scalelab.sweep_role") == "parent")
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    tune = [k for k in kids if k.data.tags.get("sweep_stage") == "tune"]
    main = [k for k in kids if k.data.tags.get("sweep_stage") == "main"]
    assert len(tune) == 6 + 6 + 4 and len(main) == 4  # tuning runs: children of the same parent
    rounds = {r: [k for k in tune if k.data.tags["sweep_tune_round"] == r]
              for r in ("lr", "batch", "beta2")}
    assert [len(v) for v in rounds.values()] == [6, 6, 4]
    assert {k.info.run_name.rsplit("-", 1)[1].rsplit("_", 1)[0] for k in rounds["batch"]} == {"b0.5x", "b1x", "b2x"}
    assert {k.info.run_name.rsplit("-", 1)[1].rsplit("_", 1)[0] for k in rounds["beta2"]} == \
        {"beta2_0.95", "beta2_0.999"}
    assert {int(k.data.params["global_batch_sequences"]) for k in rounds["batch"]} == {16, 32, 64}
    assert {float(k.data.params["beta2"]) for k in rounds["beta2"]} == {0.95, 0.999}
    assert {k.info.status for k in kids} == {"FINISHED"}
    for k in kids:  # one fixed held-out set for every point, with its standard error
        m = k.data.metrics
        assert m["final/heldout_tokens"] == 8192 and 0 < m["final/heldout_se"] < 0.1 * m["final/heldout_loss"]
    # seeds: two replicates per point, same group, different seeds, names from budget and size
    groups: dict[str, list] = {}
    for k in main:
        groups.setdefault(k.data.tags["sweep_group_id"], []).append(k)
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    for g in groups.values():
        assert {k.data.tags["sweep_replicate"] for k in g} == {"0", "1"}
        assert len({k.data.params["seed"] for k in g}) == 2
        names = sorted(k.info.run_name.rsplit("_", 1)[0] for k in g)  # <label>_<point hash>
        assert names[0].startswith("C3e9-N") and names[1] == names[0] + "-s1"
    assert all(k.info.run_name.startswith("tune-C3e9-N") for k in tune)
    # the fitted law set every point's lr, and the plan, grid runs and law are in MLflow
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "tune")}
    assert {"tune/law.json", "tune/tune.png", "tune/tune_hparams.png", "tune/runs.csv",
            "tune/plan.csv"} <= arts
    law = json.loads((tmp_path / "sweeps" / "cpu_tiny" / "tune" / "law.json").read_text())
    lr, batch = law["variants"]["default"]["lr"], law["variants"]["default"]["batch"]
    beta2 = law["variants"]["default"]["beta2"]["best"]
    assert float(parent.data.tags["lr_law_coef"]) == pytest.approx(lr["coef"], rel=1e-5)
    assert law["coef"] == lr["coef"]  # the form sweep.lr_law takes
    assert float(parent.data.tags["batch_law_coef"]) == pytest.approx(batch["coef"], rel=1e-5)
    assert float(parent.data.tags["tuned_beta2"]) == beta2 in (0.95, 0.999)
    for k in main:  # every point at its lr*(N), B*(N) (D fixed: steps from D) and beta2
        n, par = float(k.data.params["n_params_matmul"]), k.data.params
        assert float(par["lr"]) == pytest.approx(lr["coef"] * n ** lr["exponent"], rel=1e-4)
        want = round_batch(batch["coef"] * n ** batch["exponent"])
        seqs, steps = int(par["global_batch_sequences"]), int(par["max_steps"])
        assert seqs == want or (seqs < want and steps < 2 * 10)  # capped at sweep.min_steps
        assert float(par["beta2"]) == beta2
