"""The status a multirun's parent run shows: the worst outcome of its jobs so far (FAILED over
KILLED over FINISHED), so one failed job is never hidden by a later one that finished."""

from __future__ import annotations

from typing import Any

_SEVERITY = {"FINISHED": 0, "KILLED": 1, "FAILED": 2}


def record_job_outcome(client: Any, parent_id: str, status: str) -> None:
    """Close the parent with ``status`` unless an earlier job already ended it worse."""
    current = client.get_run(parent_id).info.status
    if _SEVERITY.get(current, -1) > _SEVERITY.get(status, 0):
        status = current
    client.set_terminated(parent_id, status)
