"""The SLURM jobs one launch queued through submitit, waiting until they all left the queue, and
what SLURM's accounting says became of each (a point lost with its node).

hydra-submitit-launcher collects its jobs in order and stops at the first that did not return
(a ``scancel``, a node failure): the ``scalelab-train --multirun`` process then exits while the
launch's other jobs still train. The sweep waits for those before it looks at MLflow, so it
reports each point as it really ended instead of as "never started".
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def submitted_jobs(multirun_dir: Path) -> list[str]:
    """The job ids submitit queued for a launch (its folders ``.submitit/<job>``; array tasks
    are ``<array>_<task>``, and the array's own id covers them)."""
    folder = multirun_dir / ".submitit"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and "_" not in p.name)


def queued(jobs: list[str]) -> list[str]:
    """Those of ``jobs`` (or their array tasks) still pending or running, per ``squeue``."""
    if not jobs or shutil.which("squeue") is None:
        return []
    try:
        r = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    # rc != 0: every id is unknown to slurmctld by now (ended long ago): nothing queued
    return r.stdout.split() if r.returncode == 0 else []


def wait_for_queue(multirun_dir: Path, poll_s: float, on_poll: Callable[[], None],
                   echo: Callable[[str], None]) -> None:
    """Wait while a job of this launch is still in SLURM's queue, calling ``on_poll`` between
    looks (progress reports)."""
    jobs = submitted_jobs(multirun_dir)
    left = queued(jobs)
    if left:
        echo(f"  the launcher exited; waiting for {len(left)} SLURM job(s) still queued or "
             f"running: {' '.join(left)}")
    while left:
        time.sleep(poll_s)
        on_poll()
        left = queued(jobs)


# the job ran on a node that failed (slurmd gone, the node down or rebooted): its processes are lost
LOST_STATES = ("NODE_FAIL", "BOOT_FAIL")


def task_states(multirun_dir: Path) -> dict[int, tuple[str, list[str]]]:
    """Array task index (= the point's job number in the launch) -> (its job id, the states of
    its attempts, oldest first), from ``sacct -D``: a job SLURM requeued after a node failure
    has a NODE_FAIL record before its new one. Empty without SLURM accounting."""
    jobs = submitted_jobs(multirun_dir)
    if not jobs or shutil.which("sacct") is None:
        return {}
    try:
        r = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State", "-j",
                            ",".join(jobs)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[int, tuple[str, list[str]]] = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        job, _, state = line.partition("|")
        array, _, task = job.partition("_")
        if array in jobs and task.isdigit() and state:
            out.setdefault(int(task), (job, []))[1].append(state.split()[0])
    return out


def lost_note(job: str, states: list[str]) -> str | None:
    """How a job lost its point, in words (None: no attempt of it was lost with its node)."""
    lost = [s for s in states if s in LOST_STATES]
    if not lost:
        return None
    last, said = states[-1], f"SLURM job {job} lost its node ({lost[-1]})"
    if last in LOST_STATES:  # accounting has not recorded a requeue (yet)
        return said
    return f"{said}; " + ("SLURM requeued it" if last in ("PENDING", "REQUEUED", "RUNNING")
                          else f"then {last}")


class LostJobs:
    """The points of one SLURM launch whose job lost its node: said once when ``sacct`` shows
    it, and after the launch recorded as failed, their runs closed KILLED, for a rerun to
    finish (a requeued job that then finished its point is not lost)."""

    def __init__(self, multirun_dir: Path, points: list[Any], echo: Callable[[str], None],
                 states: Callable[[Path], dict[int, tuple[str, list[str]]]] = task_states) -> None:
        self.multirun_dir, self.points, self.echo, self.states = multirun_dir, points, echo, states
        self.said: dict[int, str] = {}
        self.asked = float("-inf")

    def report(self, every_s: float = 0.0) -> dict[int, str]:
        """Array task index -> how it was lost; each new finding is echoed once. With
        ``every_s``, accounting is asked at most that often (a long sweep polls for hours)."""
        if time.monotonic() - self.asked < every_s:
            return {}
        self.asked = time.monotonic()
        notes = {}
        for i, (job, states) in self.states(self.multirun_dir).items():
            note = lost_note(job, states)
            if note is None or i >= len(self.points):
                continue
            notes[i] = note
            if self.said.get(i) != note:
                self.said[i] = note
                self.echo(f"  ! {self.points[i].name}: {note}")
        return notes

    def settle(self, latest: dict[str, Any], remaining: list[Any], failed: dict[str, str],
               parent: Any) -> list[Any]:
        """Record the lost points that did not finish; the points still to launch now.
        Called once the launch's jobs left the queue: a lost point's run still RUNNING is an
        orphan (its process died with the node), also when a requeued job started it anew."""
        notes = self.report()
        lost = {self.points[i].point_id: note for i, note in notes.items()}
        for c in parent.children() if lost else []:
            if c.point_id in lost and c.status in ("RUNNING", "SCHEDULED"):
                parent.mark_killed(c.run_id, why=lost[c.point_id])
        for i, note in notes.items():
            p = self.points[i]
            c = latest.get(p.point_id)
            if c is not None and c.done:
                continue
            failed[p.name] = f"{note}; rerun the sweep to finish it"
            self.echo(f"  ✗ {p.name}: {failed[p.name]}")
        return [p for p in remaining if p.name not in failed]
