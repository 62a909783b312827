"""One MLflow run per training run: create or reopen it, log to it, close it with a status.

Only global rank 0 gets a real ``Tracker``; every other process gets ``NullTracker``, whose
methods do nothing, so callers never branch on the rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pytorch_lightning.loggers import MLFlowLogger

from scalelab.tracking.store import (
    experiment_artifact_location,
    is_remote,
    probe,
    sqlite_init_lock,
)

log = logging.getLogger(__name__)
MAX_PARAM_LEN = 6000  # mlflow's limit for a param value
# The MLflow 3 UI opens an experiment in GenAI mode (traces, assistant) unless this tag says it
# holds model training runs; the value is the UI's ExperimentKind.CUSTOM_MODEL_DEVELOPMENT.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Keep alembic's migration chatter and mlflow's info lines out of the training output.
for _name in ("alembic", "mlflow", "mlflow.store", "mlflow.tracking"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class NullTracker:
    """Stands in on ranks > 0 and with ``logger=none``: same methods, no side effects."""

    run_id: str | None = None
    run_name: str | None = None
    experiment_id: str | None = None
    tracking_uri: str | None = None
    resumed = False

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def start_system_metrics(self, interval: float = 10.0) -> None: ...
    def lightning_logger(self) -> Any:
        return False  # Trainer(logger=False)

    def end(self, status: str = "FINISHED") -> None: ...

    @contextlib.contextmanager
    def status_guard(self) -> Iterator[None]:
        yield


class _RunLogger(MLFlowLogger):
    """Lightning's MLFlowLogger bound to our run, minus what the Tracker owns.

    - hyperparameters: the Tracker logs a curated flat set; Lightning's dump of hparams would
      add noise and, on resume, clash with values already logged;
    - status: the Tracker ends the run (FINISHED / FAILED / KILLED), not Lightning's finalize;
    - resume: steps already in the run (logged after the checkpoint we resumed from, before the
      kill) are skipped, so a metric never has two values at one step.
    """

    def __init__(self, tracker: Tracker, skip_until: dict[str, int]) -> None:
        super().__init__(run_id=tracker.run_id, tracking_uri=tracker.tracking_uri)
        self._skip_until = skip_until

    def log_hyperparams(self, params: Any) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # Lightning adds `epoch` to every logged dict; runs are step-based, so it is noise.
        metrics = {k: v for k, v in metrics.items() if k != "epoch"}
        if not metrics:
            return
        if step is not None and self._skip_until:
            metrics = {k: v for k, v in metrics.items() if step > self._skip_until.get(k, -1)}
            if not metrics:
                return
        super().log_metrics(metrics, step)

    def finalize(self, status: str = "success") -> None:
        return None


class Tracker:
    """Rank-0 handle on one MLflow run (new, or reopened for a resume)."""

    def __init__(self, client: MlflowClient, run_id: str, tracking_uri: str, resumed: bool) -> None:
        self.client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.resumed = resumed
        run = client.get_run(run_id)
        self.experiment_id = run.info.experiment_id
        self.run_name: str | None = run.info.run_name
        self._existing_params = dict(run.data.params)
        self._skip_until: dict[str, int] = {}
        if resumed:
            for key in run.data.metrics:
                history = client.get_metric_history(run_id, key)
                if history:
                    self._skip_until[key] = max(m.step for m in history)
        self._system_monitor: Any = None
        self._ended = False
        self.multirun_parent_id: str | None = None  # set for --multirun jobs (tracking/multirun.py)

    # --- creation ------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        tracking_uri: str,
        experiment_name: str,
        run_name: str,
        tags: Mapping[str, str],
        artifact_root: str | None = None,
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
        probe_timeout: float = 3.0,
    ) -> Tracker:
        """Create a run (or reopen ``resume_run_id``) in ``experiment_name``."""
        probe(tracking_uri, timeout=probe_timeout)
        mlflow.set_tracking_uri(tracking_uri)  # for anything that uses the fluent API
        with sqlite_init_lock(tracking_uri):  # a new SQLite store is created/migrated here, once
            client = MlflowClient(tracking_uri=tracking_uri)
            client.search_experiments(max_results=1)
        if resume_run_id:
            try:
                run = client.get_run(resume_run_id)
            except MlflowException as e:
                raise RuntimeError(
                    f"resume: MLflow run {resume_run_id} (from the run folder's mlflow_run_id) is "
                    f"not in {tracking_uri}: {e.message}. Resume against the store the run was "
                    "created in (logger.tracking_uri=...), or delete mlflow_run_id to start a new run."
                ) from None
            client.update_run(resume_run_id, status="RUNNING")
            log.info("resuming MLflow run %s", run.info.run_id)
            return cls(client, resume_run_id, tracking_uri, resumed=True)

        exp_id = _get_or_create_experiment(client, experiment_name, tracking_uri, artifact_root)
        all_tags = {"mlflow.runName": run_name, **{k: str(v) for k, v in tags.items()}}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
        return cls(client, run.info.run_id, tracking_uri, resumed=False)

    # --- logging -------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log a flat dict; on resume only keys the run does not have yet (mlflow forbids changes)."""
        items = []
        for key, value in params.items():
            text = "None" if value is None else str(value)
            text = text[:MAX_PARAM_LEN]
            if key in self._existing_params:
                if self._existing_params[key] != text:
                    log.warning("param %s=%s already logged as %s; keeping the old value",
                                key, text, self._existing_params[key])
                continue
            items.append(Param(key, text))
            self._existing_params[key] = text
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, int(step or 0)) for k, v in metrics.items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(str(k), str(v)) for k, v in tags.items()]
        if items:
            self.client.log_batch(self.run_id, tags=items)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def start_system_metrics(self, interval: float = 10.0) -> None:
        """CPU/memory/disk/network (and GPU with pynvml) every ``interval`` s, via psutil."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._system_monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=interval, resume_logging=self.resumed,
            tracking_uri=self.tracking_uri,
        )
        self._system_monitor.start()

    def lightning_logger(self) -> _RunLogger:
        return _RunLogger(self, dict(self._skip_until))

    # --- ending ----------------------------------------------------------------------------
    def end(self, status: str = "FINISHED") -> None:
        """Close the run: FINISHED, FAILED or KILLED (idempotent)."""
        if self._ended:
            return
        self._ended = True
        if self._system_monitor is not None:
            with contextlib.suppress(Exception):
                self._system_monitor.finish()
        RunStatus.from_string(status)  # validates the name
        self.client.set_terminated(self.run_id, status)
        if self.multirun_parent_id:  # the multirun's parent shows its latest job's outcome
            with contextlib.suppress(Exception):
                self.client.set_terminated(self.multirun_parent_id, status)

    @contextlib.contextmanager
    def status_guard(self) -> Iterator[None]:
        """FINISHED when the block returns, KILLED on Ctrl-C, FAILED on any other error."""
        try:
            yield
        except KeyboardInterrupt:
            self.end("KILLED")
            raise
        except SystemExit as e:
            # Lightning turns Ctrl-C into sys.exit(1) after its graceful shutdown.
            self.end("FINISHED" if e.code in (None, 0) else "KILLED")
            raise
        except BaseException:
            self.end("FAILED")
            raise
        else:
            self.end("FINISHED")


def _get_or_create_experiment(
    client: MlflowClient, name: str, uri: str, artifact_root: str | None
) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            raise RuntimeError(
                f"logger.experiment_name={name!r} is a deleted MLflow experiment in {uri}; "
                "restore it in the UI or pick another name"
            )
        if EXPERIMENT_KIND_TAG not in exp.tags:  # stores created before the tag existed
            with contextlib.suppress(MlflowException):
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    try:
        return client.create_experiment(
            name, artifact_location=experiment_artifact_location(uri, artifact_root, name),
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
        )
    except MlflowException:
        # Parallel sweep jobs race to create it: whoever lost reads the winner's.
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def remote_env_defaults() -> None:
    """Fail fast instead of retrying for minutes when a server dies mid-run (overridable)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


__all__ = ["NullTracker", "Tracker", "is_remote", "remote_env_defaults"]
