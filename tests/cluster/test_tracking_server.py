"""The tracking server on PostgreSQL restarted mid-run: the run's outage buffer replays, and the
store ends with every step once.

The test runs its own ``mlflow server`` on the cluster's PostgreSQL database (the shared server
keeps serving the other cluster tests), SIGKILLs its process group once the run has logged a
few steps, waits until the run buffers to disk (mlflow_pending.jsonl appears), and starts it
again on the same port and database.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tests.conftest import free_port
from tests.tracking.signal_helpers import training, wait_for_steps
from tests.tracking.test_outage import _start_server, _stop_server, restart_once_buffering

pytestmark = pytest.mark.slow
STEPS, VAL_EVERY = 60, 20


def test_server_on_postgresql_restarted_mid_run_loses_and_doubles_nothing(
    cluster, tmp_path: Path, shared_data_dir: Path, train_cli
) -> None:
    store = (cluster.folder / "mlflow" / "backend_uri").read_text().strip()
    assert store.startswith("postgresql"), store
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _start_server(tmp_path, port, store)
    run_dir = tmp_path / "run"
    args = [
        "model=gpt2_tiny",
        "data=shakespeare",
        "tokenizer=char",
        "train.global_batch_size=12",
        f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
        f"train.max_steps={STEPS}",
        f"train.val_every={VAL_EVERY}",
        "train.val_batches=1",
        "trainer.log_every_n_steps=1",
        "callbacks.sample.enabled=false",
        "optim.warmup_steps=1",
        "logger.outage_wait_s=300",
        "logger.metrics_interval_s=0",
        f"paths.output_dir={run_dir}",
        *train_cli.isolated(tmp_path, tracking_uri=uri),
    ]
    try:
        with training(train_cli.cmd(*args), train_cli.repo, train_cli.env()) as proc:
            run_id = wait_for_steps(proc, run_dir, uri, min_steps=3)
            server = restart_once_buffering(server, proc, run_dir, tmp_path, port, store)
            out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
        back = [ln for ln in out.splitlines() if "is back after" in ln]
        assert len(back) == 1, out[-4000:]
        # read back through the cluster's own server: the rows are in PostgreSQL
        client = MlflowClient(cluster.tracking_uri)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
        assert steps == list(range(steps[0], steps[0] + STEPS)), steps  # each step once
        val = [m.step for m in client.get_metric_history(run_id, "val/loss")]
        assert len(val) == len(set(val)) >= STEPS // VAL_EVERY, val
        assert not (run_dir / "mlflow_pending.jsonl").exists()  # everything was sent
    finally:
        _stop_server(server)
