"""After one launch of ``scalelab-train``: why each point it did not finish failed, the telling
line of its log, and which points to launch again (those the process never started)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .plan import PlanPoint
from .sweep_state import touched_since


def triage(points: list[PlanPoint], latest: dict[str, Any], started: float, rc: int,
           log_path: Path, multirun_dir: Path | None, failed: dict[str, str],
           echo: Callable[[str], None]) -> list[PlanPoint]:
    """Record why each point of a launch that is not done failed; return the points to retry.
    ``multirun_dir`` (None for a single-point launch) holds one folder per started job."""
    # Hydra's launchers catch a job's exception and go on with the next job; a job that
    # started has its folder <hydra.sweep.dir>/<job number> (the order of `points`).
    remaining, unrecorded = [], []
    progressed = False  # some point of this launch ended in MLflow (a stop, not a crash)
    for i, p in enumerate(points):
        c = latest.get(p.point_id)
        fresh = c is not None and touched_since(c, started)
        progressed = progressed or (fresh and c.status in ("FINISHED", "FAILED", "KILLED"))
        if c is not None and c.done:
            continue
        if fresh and c.status in ("FAILED", "KILLED", "FINISHED"):
            what = c.status if c.status != "FINISHED" else f"final val loss {c.final_loss}"
            failed.setdefault(p.name, f"run {c.run_id} {what}; see {log_path}: "
                              + error_line(log_path, p.name))
        elif multirun_dir is None or (multirun_dir / str(i)).is_dir():
            unrecorded.append(p)  # it ran, but failed before creating its MLflow run
        else:
            remaining.append(p)  # never started: the process died first
    crashed = rc < 0 or (remaining and rc != 0)
    if crashed and unrecorded:
        # the process died inside the last job it started; retry the others
        *retry, culprit = unrecorded
        remaining = retry + remaining
        unrecorded = [culprit]
    for p in unrecorded:
        failed[p.name] = (f"exit code {rc}, no FINISHED run; see {log_path}: "
                          + error_line(log_path, p.name))
        echo(f"  ✗ {p.name}: {failed[p.name]}")
    if remaining and not crashed:
        for p in remaining:
            failed[p.name] = f"never started (exit code {rc}); see {log_path}"
        remaining = []
    elif remaining and not unrecorded and not progressed:  # no progress to tell apart: blame one
        first = remaining.pop(0)
        failed[first.name] = f"exit code {rc} before it started; see {log_path}: " \
            + error_line(log_path, first.name)
    return remaining


def error_line(log_path: Path, point: str) -> str:
    """The most telling line of a log: the last 'Error'/'Exception' line, else the last line.

    In a basic-launcher multirun log, the lines after Hydra's ``#k : ... +sweep_point=<point>``
    marker (up to the next marker) belong to that point; they are searched first.
    """
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""

    def best(seg: list[str]) -> str:
        hits = [ln.strip() for ln in seg if ("Error" in ln or "Exception" in ln or
                                             ln.startswith("error:")) and ln.strip()]
        return hits[-1] if hits else ""

    marks = [i for i, ln in enumerate(lines) if "[HYDRA]" in ln and "+sweep_point=" in ln]
    mine = [i for i in marks if f"+sweep_point={point}" in lines[i]]
    if mine:
        end = next((j for j in marks if j > mine[-1]), len(lines))
        hit = best(lines[mine[-1]:end])
        if hit:
            return hit[:300]
    tail = [ln.strip() for ln in lines if ln.strip()]
    return (best(lines) or (tail[-1] if tail else ""))[:300]
