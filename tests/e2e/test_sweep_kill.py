"""Killed sweep points are reported as killed and resumed by a rerun.

One sweep of two points: SIGTERM to the first point's training process after its first
periodic checkpoint (sweeps set save_best=false, which must not turn off last.ckpt): the point
is KILLED, never "✓ val loss nan", and the sweep goes on; then SIGKILL of the whole sweep while
the second point trains. The rerun closes the orphaned RUNNING child (its PID is gone), resumes
both points' own MLflow runs from their checkpoints, and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tests.conftest import sqlite_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARGS = ["sweep=cpu_tiny", "sweep.budgets=[3e10]", "sweep.sizes_per_budget=2", "sweep.size_span=2.5",
        "sweep.fit=false", "sweep.val_evals=8"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep_kill_root")
    return root, dict(os.environ, SCALELAB_ROOT=str(root), PYTHONUNBUFFERED="1",
                      MLFLOW_TRACKING_URI=sqlite_store(root / "mlruns.db"))


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start(env, name: str) -> subprocess.Popen:
    _, e = env
    return subprocess.Popen([sys.executable, "-m", "scalelab.cli.sweep", *ARGS, f"sweep.name={name}"],
                            env=e, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_default_signals)


def _wait_for_checkpointed_child(env, name: str, proc: subprocess.Popen, skip: str = ""):
    """The first child run (other than ``skip``) that is RUNNING and has a periodic last.ckpt."""
    root, e = env
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        exp = client.get_experiment_by_name(f"sweep_{name}")
        if exp is not None:
            for r in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
                point = r.data.tags.get("sweep_point")
                if point and r.info.run_id != skip and (root / "sweeps" / name / "runs" / point / "checkpoints" / "last.ckpt").is_file():
                    return r
        time.sleep(0.1)
    pytest.fail("no child reached its first checkpoint in time")


def _rerun(env, name: str) -> subprocess.CompletedProcess:
    _, e = env
    return subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *ARGS, f"sweep.name={name}"],
                          env=e, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_killed_points_are_reported_and_resumed(env):
    _, e = env
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    proc = _start(env, "kill")
    try:
        # 1. SIGTERM to the first point's training process, after its first periodic checkpoint
        first = _wait_for_checkpointed_child(env, "kill", proc)
        os.kill(int(first.data.tags["scalelab.pid"]), signal.SIGTERM)
        # 2. the sweep goes on with the other point; SIGKILL everything once it has a checkpoint
        second = _wait_for_checkpointed_child(env, "kill", proc, skip=first.info.run_id)
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its training process, at once
        out, _ = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    p1, p2 = first.data.tags["sweep_point"], second.data.tags["sweep_point"]
    assert p1 != p2
    assert f"✗ {p1}  KILLED" in out and "val loss nan" not in out, out[-3000:]
    assert client.get_run(first.info.run_id).info.status == "KILLED"
    assert client.get_run(second.info.run_id).info.status == "RUNNING"  # nobody could close it

    again = _rerun(env, "kill")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "closed 1 child run(s) left RUNNING" in again.stdout
    assert f"resuming {p1}" in again.stdout and f"resuming {p2}" in again.stdout
    assert "2 trained now" in again.stdout
    for child in (first, second):  # the same runs, continued to the end
        run = client.get_run(child.info.run_id)
        assert run.info.status == "FINISHED" and float(run.data.tags["final.val_loss"]) > 0
