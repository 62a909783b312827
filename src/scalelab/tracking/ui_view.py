"""A saved view of a sweep in the MLflow UI: its points grouped by budget, with val loss / N / D / C.

MLflow 3.17's runs table has no URL parameter for columns, grouping or expanded parent runs.
What it has is the view its "Share" button saves: an experiment tag
``mlflow.sharedViewState.<key>`` holding the view as JSON, opened by ``?viewStateShareKey=<key>``
in the experiment's link. A shared view carries the search, sort, columns and grouping, but
not which parent runs are expanded (MLflow leaves that out), so the view groups the points by
their budget (tag ``sweep_budget``): groups open expanded, and the children are the rows.
"""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from scalelab.tracking.ui import SWEEP_VIEW_TAG  # `make ui` links to it

# column keys as the runs table names them: <metrics|params|tags>.`<key>`
SWEEP_COLUMNS = (
    "metrics.`val/loss`",               # the curve's last validation loss
    "params.`n_params_matmul`",         # N (the fits' default convention)
    "params.`tokens_budget`",           # D
    "params.`compute`",                 # C of the run (FLOPs, attention included)
    "tags.`final.heldout_loss`",        # the fixed held-out set's loss, when the sweep scores it
)


def sweep_view_state() -> dict[str, object]:
    """The view: one group per compute budget (its best val loss on the group's row), the
    points inside it, lowest val loss first, with the headline columns."""
    return {
        "orderByKey": "metrics.`val/loss`",
        "orderByAsc": True,
        "selectedColumns": list(SWEEP_COLUMNS),
        "groupBy": {"aggregateFunction": "min",
                    "groupByKeys": [{"mode": "tag", "groupByData": "sweep_budget"}]},
    }


def save_sweep_view(client: MlflowClient, experiment_id: str) -> None:
    """Store the view on the sweep's experiment (no run ids in it: reruns keep it valid)."""
    client.set_experiment_tag(experiment_id, SWEEP_VIEW_TAG, json.dumps(sweep_view_state()))
