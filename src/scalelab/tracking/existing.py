"""Reading and adding to an EXISTING run by id (scalelab-eval, scalelab-viz log back to it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from scalelab.paths import repo_root
from scalelab.tracking.run import client_for
from scalelab.tracking.store import resolve_tracking_uri


def _client(tracking_uri: str | None) -> MlflowClient:
    return client_for(resolve_tracking_uri(tracking_uri, repo_root()))


def run_output_dir(run_id: str, tracking_uri: str | None = None) -> Path:
    """The run folder that ``scalelab-train`` recorded in the run's ``scalelab.output_dir`` tag."""
    try:
        run = _client(tracking_uri).get_run(run_id)
    except MlflowException as e:
        raise ValueError(f"MLflow run {run_id}: not found in the tracking store ({e.message})") from e
    out = run.data.tags.get("scalelab.output_dir")
    if not out:
        raise ValueError(f"MLflow run {run_id}: no scalelab.output_dir tag (not a scalelab-train run)")
    return Path(out)


def log_to_run(run_id: str, tracking_uri: str | None = None,
               metrics: Mapping[str, float] | None = None,
               files: Mapping[str, Path] | None = None, step: int = 0) -> None:
    """Metrics and artifact files (artifact dir -> local file) added to a finished run."""
    client = _client(tracking_uri)
    for key, value in (metrics or {}).items():
        client.log_metric(run_id, key, float(value), step=step)
    for artifact_dir, path in (files or {}).items():
        client.log_artifact(run_id, str(path), artifact_dir)
