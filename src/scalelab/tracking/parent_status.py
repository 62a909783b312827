"""The status a multirun's parent run shows: the worst outcome of its jobs so far (FAILED over
KILLED over FINISHED), so one failed job is never hidden by a later one that finished.

Parallel jobs (joblib) may end at the same instant: each reads the parent's status, then writes
it. The read and the write happen under an ``flock`` on a file in the multirun folder, so one
job at a time updates the parent and the worst outcome always stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalelab.data.files import locked

_SEVERITY = {"FINISHED": 0, "KILLED": 1, "FAILED": 2}
STATUS_LOCK = ".mlflow_parent_status.lock"  # <multirun folder>/.mlflow_parent_status.lock


def record_job_outcome(client: Any, parent_id: str, status: str, multirun_dir: Path) -> None:
    """Close the parent with ``status`` unless an earlier job already ended it worse."""
    with locked(Path(multirun_dir) / STATUS_LOCK):
        current = client.get_run(parent_id).info.status
        if _SEVERITY.get(current, -1) > _SEVERITY.get(status, 0):
            status = current
        client.set_terminated(parent_id, status)
