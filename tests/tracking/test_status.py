"""Ctrl-C (SIGINT) during training ends the MLflow run as KILLED with exit code 130, through
the real CLI. The child resets SIGINT to the default itself: from a shell without job control
(CI, `make test &`) it would inherit "ignore SIGINT" and never stop."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests.conftest import sqlite_store

from .signal_helpers import default_signals


@pytest.mark.slow
def test_ctrl_c_marks_the_run_killed(tmp_path: Path, shared_data_dir: Path, train_cli) -> None:
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "mlruns.db")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        train_cli.cmd(
            "model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=12",
            f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "train.max_steps=100000",
            "train.val_every=1000", "trainer.log_every_n_steps=1", "callbacks.sample.enabled=false",
            "optim.warmup_steps=1", f"paths.output_dir={run_dir}",
            *train_cli.isolated(tmp_path, tracking_uri=uri),
        ),
        cwd=train_cli.repo, env=train_cli.env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=default_signals,
    )
    try:
        client = MlflowClient(uri)
        deadline = time.time() + 300
        run_id = None
        while True:  # wait until training is really under way
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.time() < deadline, "training did not start in time"
            rid = run_dir / "mlflow_run_id"
            if rid.is_file():
                run_id = rid.read_text().strip()
                if client.get_metric_history(run_id, "train/loss"):
                    break
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 130, out[-3000:]
    assert client.get_run(run_id).info.status == "KILLED", out[-2000:]
    assert "resume with: scalelab-train" in out
