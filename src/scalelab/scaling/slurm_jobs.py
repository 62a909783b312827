"""The SLURM jobs one launch queued through submitit, and waiting until they all left the queue.

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
