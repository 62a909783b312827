"""What MLflow says about a sweep's points: the newest run of each, which are done, which a killed
sweep left RUNNING, and which can continue from their checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plan import PlanPoint


def latest_by_point(children: list[Any]) -> dict[str, Any]:
    """point id -> its newest child run; a done one is never displaced by a later attempt."""
    latest: dict[str, Any] = {}
    for c in sorted(children, key=lambda c: c.start_time):
        prev = latest.get(c.point_id) if c.point_id else None
        if c.point_id and (prev is None or not prev.done or c.done):
            latest[c.point_id] = c
    return latest


def close_stale(parent: Any) -> int:
    """Children left RUNNING by a killed sweep -> KILLED (they are resumed or retrained);
    one whose process still runs on this machine is left alone. Returns how many."""
    n = 0
    for c in parent.children():
        if c.status in ("RUNNING", "SCHEDULED") and not c.process_alive():
            parent.mark_killed(c.run_id)
            n += 1
    return n


def resumable(p: PlanPoint, latest: dict[str, Any], sweep_dir: Path) -> bool:
    """A point whose run was stopped (KILLED) after a checkpoint continues that run."""
    c = latest.get(p.point_id)
    run_dir = sweep_dir / "runs" / p.name
    rid = run_dir / "mlflow_run_id"
    return (c is not None and c.status == "KILLED" and rid.is_file()
            and (run_dir / "checkpoints" / "last.ckpt").is_file()
            and rid.read_text().strip() == c.run_id)


def split_done(points: list[PlanPoint], latest: dict[str, Any]
               ) -> tuple[list[PlanPoint], list[PlanPoint]]:
    """(the points still to train, the points with a done run)."""
    done = [p for p in points if latest.get(p.point_id) is not None and latest[p.point_id].done]
    ids = {p.point_id for p in done}
    return [p for p in points if p.point_id not in ids], done


def touched_since(c: Any, started: float) -> bool:
    """Started or ended during this launch (a resumed child keeps its old start time). The
    end time gets no slack: close_stale ends orphaned children just before the launch."""
    return c.start_time >= started * 1000 - 1000 or (c.end_time or 0) > started * 1000
