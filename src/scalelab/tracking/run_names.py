"""Run names unique within an MLflow experiment: the same command twice gives ``NAME`` and
``NAME #2`` (the second run of that name), so the runs table never shows two identical rows.

Only the MLflow side changes: the run folder keeps ``<time>_NAME`` (config/run_name.py), whose
time already tells the two apart on disk; summary.json, the banner and the checkpoint take the
MLflow name, so the run's name is the same everywhere but its folder.

A sweep point trained again (its earlier run failed, diverged, or was stopped before a
checkpoint) is the other case: its folder is the point's (``runs/<point>``), so the new run
takes the point's name and the earlier runs of that point become ``NAME (attempt k)``.
"""

from __future__ import annotations

import re

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

REPEAT = " #"  # NAME #2, NAME #3, ...
POINT_ID_TAG = "sweep_point_id"  # a sweep point's runs (tracking/sweep.py); set through `tags:`
LIVE = ("RUNNING", "SCHEDULED")  # runs that may still be written: never renamed


def unique_run_name(client: MlflowClient, experiment_id: str, name: str) -> str:
    """``name``, or ``name #k`` with the first k (from 2) that no run of the experiment
    (deleted ones included: they can be restored) is named."""
    quote = "'" if "'" not in name else '"'
    if quote in name:  # both quote kinds: the search syntax cannot hold it; keep the name
        return name

    def search(condition: str) -> list[str]:
        runs = client.search_runs([experiment_id], f"attributes.run_name {condition}",
                                  run_view_type=ViewType.ALL, max_results=50_000)
        return [r.info.run_name or "" for r in runs]

    if not search(f"= {quote}{name}{quote}"):
        return name
    # LIKE's wildcards (% _) in the name only widen the search; the pattern below is exact
    repeat = re.compile(re.escape(name + REPEAT) + r"(\d+)")
    taken = {int(m.group(1)) for n in search(f"LIKE {quote}{name}{REPEAT}%{quote}")
             if (m := repeat.fullmatch(n))}
    return f"{name}{REPEAT}{next(k for k in range(2, len(taken) + 3) if k not in taken)}"


def retire_earlier_attempts(client: MlflowClient, experiment_id: str, parent_run_id: str,
                            point_id: str, name: str) -> list[str]:
    """Rename the ended runs of sweep point ``point_id`` under ``parent_run_id`` that hold
    ``name`` (or ``name #k``) to ``name (attempt k)``, k counting the point's runs from the
    first, so that its new run can take ``name``. Returns the new names."""
    runs = client.search_runs(
        [experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}' and "
        f"tags.`{POINT_ID_TAG}` = '{point_id}'", order_by=["attributes.start_time ASC"],
        max_results=1000)
    repeat = re.compile(re.escape(name) + "(" + re.escape(REPEAT) + r"\d+)?")
    renamed = []
    for k, run in enumerate(runs, 1):
        if run.info.status not in LIVE and repeat.fullmatch(run.info.run_name or ""):
            new = f"{name} (attempt {k})"
            client.update_run(run.info.run_id, name=new)  # MLflow's public rename
            renamed.append(new)
    return renamed
