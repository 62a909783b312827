"""An Optuna search whose study lives on the cluster's PostgreSQL server (the database
`make cluster-up` makes for it) and whose trials run in parallel as SLURM jobs: each trial
reports its val loss to the shared study from its own job, and the pruner stops the worse ones
there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from tests.conftest import REPO, session_data_dir

pytestmark = pytest.mark.slow


def test_parallel_trials_prune_against_a_postgresql_study(cluster, tmp_path: Path, shared_data_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    study_name = f"pg_{tmp_path.name}"
    cmd = [sys.executable, "-m", "scalelab.cli.train", "-m", "+experiment=shakespeare_char",
           "hparams_search=shakespeare_char_optuna", f"hydra.sweeper.study_name={study_name}",
           "hydra/launcher=slurm_cpu", "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4",
           "hydra.sweeper.sampler=random", "hydra.sweeper.seed=0",
           "hydra.sweeper.pruner_startup_trials=1",
           # one lr that learns and one that cannot: the second batch has a trial to prune
           "optim.lr=choice(0.01,1e-7)", "optim.warmup_steps=0", "optim.weight_decay=0.1",
           f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "model.n_layers=1",
           "model.d_model=32", "model.n_heads=2", "train.max_steps=4", "train.val_every=2",
           "train.val_batches=1", "train.global_batch_size=4", "callbacks.sample.enabled=false",
           "trainer.enable_progress_bar=false", "logger.probe_timeout=60",
           f"logger.experiment_name=optuna_{tmp_path.name}", f"paths.data_dir={session_data_dir()}"]
    r = subprocess.run(cmd, cwd=REPO, env=cluster.env(SCALELAB_ROOT=str(tmp_path)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"in {cluster.optuna_storage}:" in r.stdout, r.stdout[-3000:]
    assert not (tmp_path / "optuna.db").exists()  # nothing went to the SQLite default

    monkeypatch.setenv("PGPASSFILE", cluster.pgpass_file)
    study = optuna.load_study(study_name=study_name, storage=cluster.optuna_storage)
    states = sorted(t.state.name for t in study.trials)
    assert len(states) == 4 and "COMPLETE" in states and "PRUNED" in states, states
    for t in study.trials:  # every job reported to the shared study from its own process
        assert t.intermediate_values, t
        if t.state.name == "PRUNED":
            assert t.user_attrs["pruned_at_step"] == max(t.intermediate_values) == 2, t
            assert f"[optuna] trial {t.number} pruned at step 2" in r.stdout
    best = yaml.safe_load(next(tmp_path.glob("multirun/search_*/best_trial.yaml")).read_text())
    assert best["trial"] == study.best_trial.number and {k: str(v) for k, v in best["params"].items()} == {"optim.lr": "0.01"}

    # a pruned trial's run says so in MLflow, as a child of the search's one parent
    client = MlflowClient(cluster.tracking_uri)
    exp = client.get_experiment_by_name(f"optuna_{tmp_path.name}")
    runs = client.search_runs([exp.experiment_id])
    kids = [x for x in runs if "mlflow.parentRunId" in x.data.tags]
    assert len(kids) == 4 and len({k.data.tags["mlflow.parentRunId"] for k in kids}) == 1
    pruned = sorted(k.data.tags["optuna.trial"] for k in kids if "optuna.pruned_at_step" in k.data.tags)
    assert pruned == sorted(str(t.number) for t in study.trials if t.state.name == "PRUNED")
