"""One MLflow run per training run: create or reopen it, log to it, close it with a status.

Only global rank 0 gets a real ``Tracker``; every other process gets ``NullTracker``, whose
methods do nothing, so callers never branch on the rank. The Tracker lives in the training
process; metric values reach MLflow through its asynchronous logging (tracking/spool.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from scalelab.tracking.guard import StatusGuarded
from scalelab.tracking.null import NullTracker
from scalelab.tracking.process import process_alive
from scalelab.tracking.redact import redact
from scalelab.tracking.run_names import POINT_ID_TAG, retire_earlier_attempts, unique_run_name
from scalelab.tracking.spool import Spool, coalesce, read_pending
from scalelab.tracking.store import (
    PROBE_TIMEOUT_S,
    experiment_artifact_location,
    is_remote,
    probe,
    remote_env_defaults,
    sqlite_init_lock,
)
from scalelab.tracking.store_check import damaged_store

log = logging.getLogger(__name__)
MAX_PARAM_LEN = 6000  # mlflow's limit for a param value
# The MLflow 3 UI opens an experiment in GenAI mode (traces, assistant) unless this tag says it
# holds model training runs; the value is the UI's ExperimentKind.CUSTOM_MODEL_DEVELOPMENT.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Keep alembic's migration chatter and mlflow's info lines out of the training output.
for _name in ("alembic", "mlflow", "mlflow.store", "mlflow.tracking"):
    logging.getLogger(_name).setLevel(logging.WARNING)
# A failed asynchronous batch is reported by the Spool (outage warning or the error itself);
# MLflow's own error line for it would repeat that once per batch.
logging.getLogger("mlflow.utils.async_logging").setLevel(logging.CRITICAL)


@functools.cache
def client_for(tracking_uri: str) -> MlflowClient:
    """One client per store and process: a multirun's later jobs reuse the open store. A new
    SQLite store is created and migrated here, once, under a lock (parallel sweep jobs)."""
    try:
        with sqlite_init_lock(tracking_uri):
            client = MlflowClient(tracking_uri=tracking_uri)
            client.search_experiments(max_results=1)
    except Exception as e:  # a damaged mlruns.db: one line naming it and the fix
        damaged = damaged_store(tracking_uri, e)
        if damaged is None:
            raise
        raise damaged from None
    return client


def process_tags() -> dict[str, str]:
    """Who runs the run (this process): a RUNNING run whose process is gone can then be found
    and closed."""
    import socket

    import psutil

    pid = os.getpid()
    return {"scalelab.host": socket.gethostname(), "scalelab.pid": str(pid),
            "scalelab.pid_start": f"{psutil.Process(pid).create_time():.2f}"}


class Tracker(StatusGuarded):
    """Rank-0 handle on one MLflow run (new, or reopened for a resume)."""

    def __init__(self, client: MlflowClient, run_id: str, tracking_uri: str, resumed: bool,
                 folder: Path | None = None, outage_wait_s: float = 120.0,
                 metrics_interval_s: float = 0.0) -> None:
        self.client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.resumed = resumed
        self.spool = Spool(client, run_id, tracking_uri, folder, metrics_interval_s=metrics_interval_s)
        self.outage_wait_s = outage_wait_s
        run = client.get_run(run_id)
        self.experiment_id = run.info.experiment_id
        self.run_name: str | None = run.info.run_name
        self._existing_params = dict(run.data.params)
        self.skip_until: dict[str, int] = {}
        if resumed:
            for key in run.data.metrics:
                history = client.get_metric_history(run_id, key)
                if history:
                    self.skip_until[key] = max(m.step for m in history)
        self._system_monitor: Any = None
        self._ended = False
        self.multirun_parent_id: str | None = None  # set for --multirun jobs (tracking/multirun.py)
        self.multirun_dir: Path | None = None  # their multirun folder (holds the status lock)

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
        probe_timeout: float = PROBE_TIMEOUT_S,
        folder: Path | None = None,
        outage_wait_s: float = 120.0,
        metrics_interval_s: float = 0.0,
    ) -> Tracker:
        """Create a run (or reopen ``resume_run_id``) in ``experiment_name``.

        ``folder`` (the run folder) holds the calls an outage kept from the server
        (mlflow_pending.jsonl); ``outage_wait_s`` is how long ``end`` waits for it to return;
        metric values are sent at most every ``metrics_interval_s`` seconds (see Spool).
        """
        probe(tracking_uri, timeout=probe_timeout)
        mlflow.set_tracking_uri(tracking_uri)  # for anything that uses the fluent API
        client = client_for(tracking_uri)
        if resume_run_id:
            try:
                run = client.get_run(resume_run_id)
            except MlflowException as e:
                raise RuntimeError(
                    f"resume: MLflow run {resume_run_id} (from the run folder's mlflow_run_id) is "
                    f"not in {redact(tracking_uri)}: {redact(e.message)}. Resume against the store the run was "
                    "created in (logger.tracking_uri=...), or delete mlflow_run_id to start a new run."
                ) from None
            _warn_if_still_written(run)
            if folder is not None:  # what the previous attempt could not send goes first
                replay_pending(client, resume_run_id, folder)
            client.update_run(resume_run_id, status="RUNNING")
            tags = [RunTag(k, v) for k, v in process_tags().items()]
            client.log_batch(resume_run_id, tags=tags)
            log.info("resuming MLflow run %s", run.info.run_id)
            return cls(client, resume_run_id, tracking_uri, resumed=True, folder=folder,
                       outage_wait_s=outage_wait_s, metrics_interval_s=metrics_interval_s)

        exp_id = get_or_create_experiment(client, experiment_name, tracking_uri, artifact_root)
        point = tags.get(POINT_ID_TAG)
        if parent_run_id and point:  # a sweep point trained again takes its own name back
            for new in retire_earlier_attempts(client, exp_id, parent_run_id, point, run_name):
                log.info("an earlier run of this sweep point is now named %r", new)
        run_name = unique_run_name(client, exp_id, run_name)  # the same command twice: NAME #2
        all_tags = {"mlflow.runName": run_name, **{k: str(v) for k, v in tags.items()},
                    **process_tags()}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
        return cls(client, run.info.run_id, tracking_uri, resumed=False, folder=folder,
                   outage_wait_s=outage_wait_s, metrics_interval_s=metrics_interval_s)

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
        self.spool.log_batch(params=items)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, int(step or 0)) for k, v in metrics.items()]
        self.spool.log_batch(metrics=items)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.spool.log_batch(tags=[RunTag(str(k), str(v)) for k, v in tags.items()])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.spool.log_artifact(path, artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.spool.log_text(text, artifact_file)

    def start_system_metrics(self, interval: float = 10.0) -> None:
        """CPU/memory/disk/network (and GPU with pynvml) every ``interval`` s, via psutil."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._system_monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=interval, resume_logging=self.resumed,
            tracking_uri=self.tracking_uri,
        )
        self._system_monitor.start()

    @property
    def ended(self) -> bool:
        return self._ended

    def lightning_logger(self) -> Any:
        """Lightning's logger of this run (a RunLogger; Lightning is imported only here)."""
        from scalelab.tracking.lightning import RunLogger

        return RunLogger(self, self.skip_until)

    # --- ending ----------------------------------------------------------------------------
    def end(self, status: str = "FINISHED") -> bool:
        """Close the run: FINISHED, FAILED or KILLED (idempotent). Never raises: it runs on
        every way out, often while another error is on its way up.

        Metrics an outage kept back are sent first (waiting up to ``outage_wait_s`` for the
        server); if it stays away, they and the status stay in the run folder's
        mlflow_pending.jsonl, one warning line says how to send them, and False is returned.
        """
        if self._ended:
            return True
        self._ended = True
        if self._system_monitor is not None:
            with contextlib.suppress(Exception):
                self._system_monitor.finish()
        RunStatus.from_string(status)  # validates the name
        if self.multirun_parent_id and self.multirun_dir:  # the parent shows its worst job's outcome
            from scalelab.tracking.parent_status import record_job_outcome

            with contextlib.suppress(Exception):
                record_job_outcome(self.client, self.multirun_parent_id, status, self.multirun_dir)
        # a KILLED run is usually on a grace period (docker 10 s, SLURM/k8s 30 s): wait less
        wait = self.outage_wait_s if status != "KILLED" else min(self.outage_wait_s, 10.0)
        try:
            self.spool.set_terminated(status)
            if self.spool.flush(wait):
                return True
            why = f"unreachable for {wait:.0f} s"
        except Exception as e:  # a real error from a live server: say it in one line
            why = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        where = self.spool.path.parent if self.spool.path else "<run folder>"
        log.warning("could not record status %s of MLflow run %s in %s (%s); it and %d pending "
                    "call(s) are kept in %s: send them with `python -m scalelab.tracking.recover "
                    "replay %s`", status, self.run_id, redact(self.tracking_uri), why,
                    len(self.spool.pending), self.spool.path or "memory only", where)
        return False


def _warn_if_still_written(run: Any) -> None:
    """The run folder's lock is the guard against two writers; where the filesystem cannot
    lock (some network mounts) or the other writer is on another host, the run's own status
    and host/PID tags are the backup: say who may still be writing into it."""
    tags = run.data.tags
    if run.info.status != "RUNNING" or tags.get("scalelab.pid") == str(os.getpid()):
        return
    if process_alive(tags) and tags.get("scalelab.host"):
        log.warning("MLflow run %s is RUNNING, last written by PID %s on host %s; if that "
                    "process still runs, stop it first: two processes would write into one run",
                    run.info.run_id, tags.get("scalelab.pid"), tags.get("scalelab.host"))


def get_or_create_experiment(
    client: MlflowClient, name: str, uri: str, artifact_root: str | None
) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            raise RuntimeError(
                f"logger.experiment_name={name!r} is a deleted MLflow experiment in {redact(uri)}; "
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


def replay_pending(client: MlflowClient, run_id: str, folder: Path) -> int:
    """Send what a run folder's mlflow_pending.jsonl still owes ``run_id``; returns the count."""
    ops = read_pending(folder)
    if not ops:
        return 0
    spool = Spool(client, run_id, "", folder)
    for op in coalesce(ops):
        spool._apply(op)  # raises on the first failure: the file stays for the next try
    (folder / "mlflow_pending.jsonl").unlink(missing_ok=True)
    log.warning("sent %d call(s) an earlier tracking outage had kept in %s", len(ops), folder)
    return len(ops)


__all__ = ["NullTracker", "Tracker", "client_for", "is_remote", "process_tags",
           "remote_env_defaults", "replay_pending"]
