"""`scalelab-train -m hparams_search=NAME`: an Optuna search through Hydra, killed and resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from scalelab.training.pruning import PRUNED_AT, PruneOnValLoss, make_pruner, open_trial


def test_the_pruner_stops_a_worse_run_through_the_shared_storage(tmp_path: Path) -> None:
    """A job's trial opened from the study's storage (as a job in another process opens it):
    its reports land there, the pruner stops it, and the search sees the step it stopped at."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, load_if_exists=False,
                                pruner=make_pruner("median", 1, 0))
    good = study.ask()
    good.report(1.0, 2)
    study.tell(good, 1.0)
    asked = study.ask()
    cb = PruneOnValLoss(open_trial(storage, "s", asked.number, make_pruner("median", 1, 0)))
    trainer = SimpleNamespace(callback_metrics={"val/loss": 3.0}, global_step=2,
                              sanity_checking=False, should_stop=False,
                              strategy=SimpleNamespace(reduce_boolean_decision=lambda d, all: d))
    cb.on_validation_end(trainer, None)
    assert trainer.should_stop and cb.pruned_at == 2
    seen = study.get_trials(deepcopy=False)[asked.number]  # the search's own handle
    assert seen.intermediate_values == {2: 3.0} and seen.user_attrs == {PRUNED_AT: 2}
    # a job that cannot reach the study (another machine, no shared file): one line, the fix
    with pytest.raises(ValueError, match="SCALELAB_OPTUNA_STORAGE") as e:
        open_trial(f"sqlite:///{tmp_path / 'elsewhere' / 'optuna.db'}", "s", 1, None)
    assert "hydra.sweeper.storage" in str(e.value) and "\n" not in str(e.value)


def _search(tmp: Path, shared: Path, train_cli, n_trials: int) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli.train", "-m", "+experiment=shakespeare_char",
            "hparams_search=shakespeare_char_optuna", f"hydra.sweeper.n_trials={n_trials}",
            "hydra.sweeper.seed=0", f"data.path={shared / 'tinyshakespeare.txt'}",
            "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.max_steps=4",
            "train.val_every=2", "train.val_batches=1", "train.global_batch_size=4",
            "callbacks.sample.enabled=false", "trainer.enable_progress_bar=false",
            f"paths.data_dir={train_cli.data_dir()}",
            f"logger.tracking_uri={train_cli.store(tmp / 'mlruns.db')}"]


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.slow
def test_a_killed_search_resumes_under_one_parent(tmp_path: Path, shared_data_dir: Path,
                                                  train_cli) -> None:
    from mlflow.tracking import MlflowClient

    tests_dir = Path(__file__).resolve().parents[1]  # `cli.sigterm_at_step` for the child
    env = train_cli.env(SCALELAB_ROOT=str(tmp_path), PYTHONPATH=os.pathsep.join(
        [str(tests_dir), os.environ.get("PYTHONPATH", "")]))
    folder = tmp_path / "multirun" / "search_shakespeare_char_optuna"
    # the second trial SIGTERMs its own process at its step 2: the search stops there
    kill = "+callbacks.kill={_target_: cli.sigterm_at_step.SigtermAtStep, step: 2, job: 1}"
    proc = subprocess.Popen([*_search(tmp_path, shared_data_dir, train_cli, 3), kill], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_signals)
    try:
        first = proc.communicate(timeout=600)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode != 0, first[-3000:]
    r = subprocess.run(_search(tmp_path, shared_data_dir, train_cli, 3), env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "trial(s) done" in r.stdout and "0 trial(s) done" not in r.stdout, r.stdout[-3000:]
    study = optuna.load_study(study_name="shakespeare_char_optuna",
                              storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(study.trials) == 3 and study.best_trial.state.name == "COMPLETE"
    best = yaml.safe_load((folder / "best_trial.yaml").read_text())
    assert best["trial"] == study.best_trial.number and best["command"].startswith("scalelab-train ")
    assert "optim.lr=" in best["command"] and "hparams_search" not in best["command"]
    # every trial is a child of the search's one MLflow parent run
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    parents = {x.info.run_id for x in runs if "mlflow.parentRunId" not in x.data.tags}
    kids = [x for x in runs if "mlflow.parentRunId" in x.data.tags]
    assert len(parents) == 1 and {k.data.tags["mlflow.parentRunId"] for k in kids} == parents
    assert sum(k.info.status == "FINISHED" for k in kids) >= 2
    # the parent carries the best trial: value, params and the trial's own run
    tags = client.get_run(parents.pop()).data.tags
    assert tags["optuna.best_trial"] == str(study.best_trial.number), tags
    assert float(tags["optuna.best_value"]) == float(f"{study.best_trial.value:.6g}")
    assert {k.removeprefix("optuna.best."): v for k, v in tags.items()
            if k.startswith("optuna.best.")} == {k: str(v) for k, v in best["params"].items()}
    best_run = next(k for k in kids if k.info.run_id == tags["optuna.best_run_id"])
    assert best_run.info.status == "FINISHED"
    assert "tagged the MLflow parent run" in r.stdout, r.stdout[-3000:]
