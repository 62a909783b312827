"""Kill a run with SIGKILL after its first checkpoint, resume it: the same MLflow run continues."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests.conftest import sqlite_store

# Long enough that 1.5 s past the first checkpoint is mid-run on a fast machine too: with 120
# steps a run can finish, and close its MLflow run, before the kill arrives.
STEPS = 600


@pytest.mark.slow
def test_sigkill_then_resume_continues_the_same_mlflow_run(tmp_path: Path, shared_data_dir: Path,
                                                           train_cli) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    uri = sqlite_store(tmp_path / "mlruns.db")
    args = [
        "model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=12", "run_name=resume_me",
        f"data.path={shared_data_dir / 'tinyshakespeare.txt'}",
        f"train.max_steps={STEPS}", "train.val_every=20", "train.val_batches=2", "optim.warmup_steps=10",
        "trainer.log_every_n_steps=2", "callbacks.sample.enabled=false",
        "logger.experiment_name=resume_test", f"paths.output_dir={run_dir}",
        *train_cli.isolated(tmp_path, tracking_uri=uri),
    ]
    proc = subprocess.Popen(train_cli.cmd(*args), cwd=train_cli.repo, env=train_cli.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    deadline = time.time() + 400
    try:
        while not ckpt.is_file():
            assert proc.poll() is None, f"run ended before its first checkpoint: {proc.stdout.read()[-3000:]}"
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        time.sleep(1.5)  # let it log a few steps past the checkpoint (they must not duplicate)
        assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    finally:  # SIGKILL: no disposition to reset, but never leave the child behind
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    run_id = (run_dir / "mlflow_run_id").read_text().strip()

    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"  # killed hard: nobody closed it
    steps_before = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps_before and max(steps_before) < STEPS

    r = train_cli.run(*args, "resume=true", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    exp = client.get_experiment_by_name("resume_test")
    runs = client.search_runs([exp.experiment_id])
    assert [x.info.run_id for x in runs] == [run_id]  # no second run
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("train/loss", "val/loss", "lr", "tokens_seen"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} has duplicated steps: {sorted(steps)}"
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert steps[-1] >= STEPS - 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["metrics"]["final/steps"] == STEPS
    assert summary["resumed_from"].endswith("last.ckpt")
    assert "final.val_loss" in run.data.tags
    assert len(list((tmp_path / "outputs").glob("*/*"))) == 0  # resume made no new run folder
