"""A tracking-server outage mid-run does not kill training.

A real `mlflow server` (SQLite store, fixed port) is SIGKILLed while a run trains, stays down
until the run buffers to disk, and is started again on the same port and store. The run must finish, with every
train/loss step in MLflow, one warning line for the loss and one for the recovery.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .signal_helpers import training, wait_for_steps

STEPS = 300


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _start_server(d: Path, port: int, store: str | None = None) -> subprocess.Popen:
    """``mlflow server`` on ``store`` (default: a SQLite file in ``d``), in its own process
    group; the store URI goes in the environment, where MLflow reads it (no password in ps)."""
    from tests.conftest import sqlite_store

    from scalelab.tracking.ui import server_env

    mlflow_bin = Path(sys.executable).parent / "mlflow"
    cmd = [str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "server", "--host", "127.0.0.1",
           "--port", str(port), "--artifacts-destination", str(d / "artifacts"), "--workers", "1"]
    env = dict(server_env(), MLFLOW_BACKEND_STORE_URI=store or sqlite_store(d / "mlflow.db"))
    log = open(d / "server.log", "a")  # noqa: SIM115 (the child holds it; closed with the test)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while not _healthy(url):
        if proc.poll() is not None or time.time() > deadline:
            _stop_server(proc)
            pytest.fail(f"mlflow server did not start: {(d / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    return proc


def _stop_server(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: gunicorn/uvicorn workers too
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def restart_once_buffering(server: subprocess.Popen, proc: subprocess.Popen, run_dir: Path,
                           d: Path, port: int, store: str | None = None) -> subprocess.Popen:
    """Kill ``server`` under the training ``proc``, wait until the run buffers to disk
    (mlflow_pending.jsonl appears), then start the server again on the same port and store."""
    _stop_server(server)
    pending = run_dir / "mlflow_pending.jsonl"
    deadline = time.time() + 300
    while not pending.is_file():  # the run noticed the outage and buffers to disk
        assert proc.poll() is None, "training died with the server: " + proc.stdout.read()[-3000:]
        assert time.time() < deadline, "the run never started buffering"
        time.sleep(0.2)
    return _start_server(d, port, store)


@pytest.mark.slow
def test_server_outage_mid_run_buffers_and_replays(tmp_path: Path, shared_data_dir: Path,
                                                  train_cli) -> None:
    from mlflow.tracking import MlflowClient
    from tests.conftest import free_port

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _start_server(tmp_path, port)
    run_dir = tmp_path / "run"
    args = ["model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=12",
            f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", f"train.max_steps={STEPS}",
            "train.val_every=50", "train.val_batches=2", "trainer.log_every_n_steps=1",
            "callbacks.sample.enabled=false", "optim.warmup_steps=1", "logger.outage_wait_s=300",
            f"paths.output_dir={run_dir}", *train_cli.isolated(tmp_path, tracking_uri=uri)]
    try:
        with training(train_cli.cmd(*args), train_cli.repo, train_cli.env()) as proc:
            run_id = wait_for_steps(proc, run_dir, uri, min_steps=3)
            server = restart_once_buffering(server, proc, run_dir, tmp_path, port)
            out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-4000:]
        assert "Traceback" not in out, out[-4000:]
        lost = [ln for ln in out.splitlines() if "is unreachable" in ln]
        back = [ln for ln in out.splitlines() if "is back after" in ln]
        assert len(lost) == 1 and len(back) == 1, out[-4000:]

        client = MlflowClient(uri)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
        assert len(steps) == len(set(steps)) == STEPS, sorted(set(range(STEPS + 1)) - set(steps))
        assert len(client.get_metric_history(run_id, "val/loss")) >= STEPS // 50
        assert "final.val_loss" in run.data.tags
        assert not (run_dir / "mlflow_pending.jsonl").exists()  # everything was sent
    finally:
        _stop_server(server)
