"""The MLflow side of a scaling sweep: one parent run, its child runs, and reading them back.

A sweep is one experiment holding one parent run (tag ``scalelab.sweep_role=parent``) and
one child run per plan point; each child carries ``mlflow.parentRunId`` and the tags
``sweep_point_id`` (the hash of the point's resolved settings), ``sweep_point``,
``sweep_budget`` and ``sweep_variant``. Rerunning the sweep reopens the same parent, and a
point with a FINISHED child is not trained again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus, ViewType
from mlflow.tracking import MlflowClient

from scalelab.tracking.process import process_alive
from scalelab.tracking.run import client_for, get_or_create_experiment
from scalelab.tracking.run_names import POINT_ID_TAG  # set on children through `tags:`
from scalelab.tracking.store import is_remote, probe
from scalelab.tracking.ui_view import save_sweep_view

log = logging.getLogger(__name__)
ROLE_TAG = "scalelab.sweep_role"
NAME_TAG = "scalelab.sweep_name"


@dataclass
class ChildRun:
    run_id: str
    status: str  # RUNNING | FINISHED | FAILED | KILLED | SCHEDULED
    start_time: int  # ms since epoch
    end_time: int | None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    name: str = ""

    @property
    def point_id(self) -> str | None:
        return self.tags.get(POINT_ID_TAG)

    @property
    def final_loss(self) -> float:
        """The run's final val loss: tag ``final.val_loss`` (older runs: metric final/val_loss)."""
        from scalelab.tracking.final import final_values

        return float(final_values(self.tags, self.metrics).get("val_loss", float("nan")))

    @property
    def done(self) -> bool:
        """The only test of "this point is trained": FINISHED with a finite final val loss.

        A run stopped by a signal is KILLED, a diverged one has a NaN/inf loss, and one whose
        final metrics never reached the store has none: all of them are trained again.
        """
        return self.status == "FINISHED" and math.isfinite(self.final_loss)

    def process_alive(self) -> bool:
        """True if the process that runs it is alive on THIS host (tags scalelab.host/pid)."""
        return process_alive(self.tags)


class SweepParent:
    """Handle on a sweep's parent run (created on first use, reopened afterwards)."""

    def __init__(self, client: MlflowClient, run_id: str, experiment_id: str, tracking_uri: str,
                 created: bool) -> None:
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.tracking_uri = tracking_uri
        self.created = created

    @classmethod
    def open(cls, tracking_uri: str, experiment_name: str, sweep_name: str,
             artifact_root: str | None = None, tags: Mapping[str, str] | None = None,
             ) -> SweepParent:
        probe(tracking_uri)
        client = client_for(tracking_uri)
        exp_id = get_or_create_experiment(client, experiment_name, tracking_uri, artifact_root)
        save_sweep_view(client, exp_id)  # what `make ui` opens: the points, val loss, N, D, C
        found = client.search_runs(
            [exp_id], f"tags.`{ROLE_TAG}` = 'parent' and tags.`{NAME_TAG}` = '{sweep_name}'",
            run_view_type=ViewType.ACTIVE_ONLY, order_by=["attributes.start_time DESC"],
            max_results=1)
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id, exp_id, tracking_uri, created=False)
        all_tags = {"mlflow.runName": f"sweep_{sweep_name}", ROLE_TAG: "parent",
                    NAME_TAG: sweep_name, **{k: str(v) for k, v in (tags or {}).items()}}
        run = client.create_run(exp_id, run_name=f"sweep_{sweep_name}", tags=all_tags)
        return cls(client, run.info.run_id, exp_id, tracking_uri, created=True)

    # --- logging -------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        """Params are immutable in MLflow: keys already logged keep their first value."""
        have = self.client.get_run(self.run_id).data.params
        items = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in have]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_child_metrics(self, run_id: str, metrics: Mapping[str, float]) -> None:
        """Metrics on a finished child (the forecast stage's outcome beside its forecast)."""
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0)
                                               for k, v in metrics.items()])

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)

    # --- children ------------------------------------------------------------------------
    def children(self) -> list[ChildRun]:
        return children_of(self.client, self.experiment_id, self.run_id)

    def mark_killed(self, run_id: str,
                    why: str = "its process was gone when the sweep was rerun") -> None:
        """A child left RUNNING by a killed sweep or a lost SLURM node: close it so the UI does
        not show it live."""
        self.client.set_terminated(run_id, status="KILLED")
        self.client.set_tag(run_id, "sweep_note", "left RUNNING by an interrupted sweep")
        self.client.set_tag(run_id, STALE_TAG, why)

    def plan_point_ids(self) -> set[str] | None:
        """Point hashes of the plan last logged to this parent (artifact plan/plan.json)."""
        import json
        import os
        import tempfile

        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        try:
            with tempfile.TemporaryDirectory() as tmp:
                path = self.client.download_artifacts(self.run_id, "plan/plan.json", tmp)
                points = json.loads(Path(path).read_text())["points"]
        except Exception:  # no plan logged (or unreadable): the caller uses every child
            return None
        return {p["point_id"] for p in points}

    def train_tokens(self) -> int | None:
        """The corpus's train-split size the sweep planned with (its ``train_tokens`` param)."""
        raw = self.client.get_run(self.run_id).data.params.get("train_tokens")
        try:
            return int(float(raw)) if raw not in (None, "None") else None
        except ValueError:
            return None

    def heldout_set(self) -> str | None:
        """The fingerprint of the held-out set the sweep scores on now (its ``heldout_set`` tag:
        "none" when it scores none); None for a sweep from before the tag."""
        return self.client.get_run(self.run_id).data.tags.get(HELDOUT_SET_TAG)

    def task_set(self) -> str | None:
        """The fingerprint of the task items the sweep scores on now ("none": no task)."""
        return self.client.get_run(self.run_id).data.tags.get(TASK_SET_TAG)

    def url(self) -> str:
        return run_url(self.tracking_uri, self.experiment_id, self.run_id)

    def view_url(self) -> str:
        """The sweep's saved view (its points by budget, val loss / N / D / C columns)."""
        from scalelab.tracking.ui import experiment_url

        return experiment_url(_ui_base(self.tracking_uri), self.experiment_id, sweep_view=True)


STALE_TAG = "scalelab.stale"
# parent and child: the fingerprint of the fixed held-out set (scaling.heldout.HeldoutSet); a
# child's held-out loss counts only when its tag matches its parent's
HELDOUT_SET_TAG = "heldout_set"
TASK_SET_TAG = "task_set"  # the fingerprint of the task items a point (or the sweep) scores on


def children_of(client: MlflowClient, experiment_id: str, parent_run_id: str) -> list[ChildRun]:
    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
            run_view_type=ViewType.ACTIVE_ONLY, order_by=["attributes.start_time ASC"],
            max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    return [ChildRun(r.info.run_id, r.info.status, r.info.start_time, r.info.end_time,
                     dict(r.data.tags), dict(r.data.params), dict(r.data.metrics),
                     r.info.run_name or "") for r in runs]


def open_parent(tracking_uri: str, parent_run_id: str) -> SweepParent:
    """Reopen a parent by id (for refits: scalelab-fit --parent RUN_ID)."""
    probe(tracking_uri)
    client = client_for(tracking_uri)
    run = client.get_run(parent_run_id)
    return SweepParent(client, parent_run_id, run.info.experiment_id, tracking_uri, created=False)


def find_sweep_parent(tracking_uri: str, sweep_name: str) -> SweepParent | None:
    """The newest parent run tagged with ``sweep_name``, in any experiment (None if absent)."""
    probe(tracking_uri)
    client = client_for(tracking_uri)
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not exps:
        return None
    found = client.search_runs(
        exps, f"tags.`{ROLE_TAG}` = 'parent' and tags.`{NAME_TAG}` = '{sweep_name}'",
        run_view_type=ViewType.ACTIVE_ONLY, order_by=["attributes.start_time DESC"],
        max_results=1)
    if not found:
        return None
    run = found[0]
    return SweepParent(client, run.info.run_id, run.info.experiment_id, tracking_uri, created=False)


def metric_history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    """[(step, value)] of a metric, sorted by step (the last value wins on duplicate steps)."""
    by_step: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)):
        by_step[int(m.step)] = float(m.value)
    return sorted(by_step.items())


def _ui_base(tracking_uri: str) -> str:
    return tracking_uri.rstrip("/") if is_remote(tracking_uri) else "http://127.0.0.1:5000"


# concurrent history reads against a tracking server: below MLflow's HTTP pool size
# (MLFLOW_HTTP_POOL_MAXSIZE, 10), so every thread keeps its own kept-alive connection
HISTORY_READERS = 8


def metric_histories(client: MlflowClient, tracking_uri: str, pairs: list[tuple[str, str]],
                     ) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(run_id, key) -> metric_history, for every pair asked.

    MLflow's client reads one run's one metric per request; against a server the requests go
    out concurrently (a 500-child sweep's curves are 1 000 of them). A local store is read in
    order: SQLite serializes them anyway.
    """
    from concurrent.futures import ThreadPoolExecutor

    workers = HISTORY_READERS if is_remote(tracking_uri) else 1
    if workers == 1 or len(pairs) < 2:
        return {(r, k): metric_history(client, r, k) for r, k in pairs}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mlflow-history") as pool:
        got = pool.map(lambda rk: metric_history(client, *rk), pairs)
        return dict(zip(pairs, got, strict=True))


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Where to see a run: the server's page, or the `make ui` page for a local store."""
    base = _ui_base(tracking_uri)
    # workflowType: MLflow 3.17 would open the run in GenAI mode without it
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


TERMINAL = {RunStatus.to_string(s) for s in (RunStatus.FINISHED, RunStatus.FAILED,
                                                RunStatus.KILLED)}

__all__ = ["POINT_ID_TAG", "TERMINAL", "ChildRun", "SweepParent", "children_of",
           "find_sweep_parent",
           "metric_histories", "metric_history", "open_parent", "run_url"]
