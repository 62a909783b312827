"""Killed sweep points are reported as killed and resumed by a rerun (issue 11, faults 1, 5, 6).

- SIGTERM to a point's training process after its first periodic checkpoint: the point is
  KILLED (never "✓ val loss nan"), the other points still train, the sweep exits 1; a rerun
  resumes that point's own MLflow run from its last.ckpt (sweeps set save_best=false, which
  must not turn off last.ckpt) and exits 0.
- SIGKILL of the whole sweep while a point trains: the rerun closes the orphaned RUNNING child
  (its PID is gone) and resumes it from its checkpoint.
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

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ARGS = ["sweep=cpu_tiny", "sweep.budgets=[3e10]", "sweep.sizes_per_budget=2", "sweep.size_span=2.5",
        "sweep.fit=false", "sweep.val_evals=8"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep_kill_root")
    return root, dict(os.environ, SCALELAB_ROOT=str(root), PYTHONUNBUFFERED="1",
                      MLFLOW_TRACKING_URI=f"sqlite:///{root}/mlruns.db")


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _start(env, name: str) -> subprocess.Popen:
    _, e = env
    return subprocess.Popen([sys.executable, "-m", "scalelab.cli.sweep", *ARGS, f"sweep.name={name}"],
                            env=e, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=_default_signals)


def _wait_for_checkpointed_child(env, name: str, proc: subprocess.Popen):
    """The first child run that is RUNNING and has a periodic last.ckpt in its run folder."""
    root, e = env
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        exp = client.get_experiment_by_name(f"sweep_{name}")
        if exp is not None:
            for r in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
                point = r.data.tags.get("sweep_point")
                if point and (root / "sweeps" / name / "runs" / point / "checkpoints" / "last.ckpt").is_file():
                    return r
        time.sleep(0.1)
    pytest.fail("no child reached its first checkpoint in time")


def _rerun(env, name: str) -> subprocess.CompletedProcess:
    _, e = env
    return subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", *ARGS, f"sweep.name={name}"],
                          env=e, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_sigterm_point_is_killed_then_resumed(env):
    _, e = env
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    proc = _start(env, "term")
    try:
        child = _wait_for_checkpointed_child(env, "term", proc)
        os.kill(int(child.data.tags["scalelab.pid"]), signal.SIGTERM)
        out, _ = proc.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    point = child.data.tags["sweep_point"]
    assert proc.returncode == 1, out[-3000:]
    assert f"✗ {point}  KILLED" in out and "val loss nan" not in out, out[-3000:]
    assert "1 trained now" in out and "1 failed" in out, out[-3000:]
    assert client.get_run(child.info.run_id).info.status == "KILLED"

    again = _rerun(env, "term")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resuming {point}" in again.stdout and "1 trained now" in again.stdout
    run = client.get_run(child.info.run_id)  # the same run, continued
    assert run.info.status == "FINISHED" and run.data.metrics["final/val_loss"] > 0


def test_sigkilled_sweep_point_resumes_from_its_checkpoint(env):
    _, e = env
    client = MlflowClient(e["MLFLOW_TRACKING_URI"])
    proc = _start(env, "kill")
    try:
        child = _wait_for_checkpointed_child(env, "kill", proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its training process, at once
        proc.wait()
        proc.stdout.close()
    assert client.get_run(child.info.run_id).info.status == "RUNNING"  # nobody could close it

    again = _rerun(env, "kill")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "closed 1 child run(s) left RUNNING" in again.stdout
    assert f"resuming {child.data.tags['sweep_point']}" in again.stdout
    run = client.get_run(child.info.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["final/val_loss"] > 0
