"""One parent MLflow run per Hydra ``--multirun``, so its jobs sit together in the UI.

The parent is found through ``<sweep dir>/mlflow_parent_run_id``: the first job creates the
run and writes the file under a lock, later jobs (sequential, or parallel joblib processes)
read it. Each job that ends sets the parent's status to the worst outcome so far (FAILED over
KILLED over FINISHED), one job at a time (tracking/parent_status.py), so one failed job, even
one refused before it had a run, leaves the parent FAILED.
"""

from __future__ import annotations

from pathlib import Path

from scalelab.data.files import locked
from scalelab.tracking.parent_status import record_job_outcome
from scalelab.tracking.run import client_for, get_or_create_experiment
from scalelab.tracking.run_names import unique_run_name

PARENT_FILE = "mlflow_parent_run_id"
ROLE_TAG = "scalelab.multirun_role"


def parent_run_id(tracking_uri: str, experiment_name: str, sweep_dir: Path, name: str,
                  artifact_root: str | None = None) -> str:
    """The multirun's parent run id (created on first call)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    id_file = sweep_dir / PARENT_FILE
    with locked(sweep_dir / f".{PARENT_FILE}.lock"):
        if id_file.is_file() and id_file.read_text().strip():
            return id_file.read_text().strip()
        client = client_for(tracking_uri)
        exp_id = get_or_create_experiment(client, experiment_name, tracking_uri, artifact_root)
        name = unique_run_name(client, exp_id, name)  # the same multirun twice: NAME #2
        run = client.create_run(exp_id, run_name=name, tags={
            "mlflow.runName": name, ROLE_TAG: "parent", "scalelab.multirun_dir": str(sweep_dir)})
        id_file.write_text(run.info.run_id + "\n")
        return run.info.run_id


def record_refused_job(tracking_uri: str, experiment_name: str, sweep_dir: Path, name: str,
                       artifact_root: str | None = None) -> None:
    """A job that failed before it had an MLflow run (a bad config value) marks the parent
    FAILED, creating the parent if this was the first job."""
    parent = parent_run_id(tracking_uri, experiment_name, sweep_dir, name, artifact_root)
    record_job_outcome(client_for(tracking_uri), parent, "FAILED", sweep_dir)


def tag_parent(tracking_uri: str, sweep_dir: Path, tags: dict[str, str]) -> str | None:
    """Set ``tags`` on the multirun's parent run (an Optuna search's best trial); returns the
    parent's id, None when no job created one (an untracked search)."""
    id_file = sweep_dir / PARENT_FILE
    if not id_file.is_file() or not id_file.read_text().strip():
        return None
    run_id = id_file.read_text().strip()
    from mlflow.entities import RunTag

    client_for(tracking_uri).log_batch(run_id, tags=[RunTag(k, str(v)[:5000])
                                                     for k, v in tags.items()])
    return run_id
