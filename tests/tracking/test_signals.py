"""Signals end a run truthfully, through the real CLI and real signals.

SIGTERM -> checkpoint at a step boundary, MLflow KILLED, summary.json KILLED, exit 143, and the
printed resume command continues the same MLflow run. SIGUSR1 under SLURM -> the same, plus a
requeue attempt that fails here (no scontrol) with one line; the requeued job (SLURM_RESTART_COUNT)
resumes by itself.
"""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import pytest
from tests.conftest import sqlite_store

from .signal_helpers import ckpt_step, training, wait_for_steps


def _args(tmp_path: Path, data_dir: Path, train_cli, uri: str, run_dir: Path) -> list[str]:
    # val_every is far away: the only checkpoint is the one the signal makes
    return ["model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=12",
            f"data.path={data_dir / 'tinyshakespeare.txt'}", "train.max_steps=100000",
            "train.val_every=1000", "train.val_batches=2", "trainer.log_every_n_steps=1",
            "callbacks.sample.enabled=false", "optim.warmup_steps=1", "logger.log_checkpoint=false",
            f"paths.output_dir={run_dir}", *train_cli.isolated(tmp_path, tracking_uri=uri)]


@pytest.mark.slow
def test_sigterm_checkpoints_marks_killed_exits_143_and_resumes(tmp_path: Path, shared_data_dir: Path,
                                                                train_cli) -> None:
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "mlruns.db")
    run_dir = tmp_path / "run"
    with training(train_cli.cmd(*_args(tmp_path, shared_data_dir, train_cli, uri, run_dir)),
                  train_cli.repo, train_cli.env()) as proc:
        run_id = wait_for_steps(proc, run_dir, uri)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 143, out[-3000:]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED", out[-2000:]
    assert run.data.tags["scalelab.stop_signal"] == "SIGTERM"
    assert run.data.tags["scalelab.pid"].isdigit() and run.data.tags["scalelab.host"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "KILLED" and summary["exit_code"] == 143
    step = ckpt_step(run_dir / "checkpoints" / "last.ckpt")
    assert step >= 3  # written at the stop, not at a validation (val_every=1000)

    # the printed command resumes the same run (a few more steps, so the test ends)
    line = next(ln for ln in out.splitlines() if ln.startswith("resume with: "))
    argv = shlex.split(line.removeprefix("resume with: "))
    assert argv[0] == "scalelab-train" and "resume=true" in argv
    r = train_cli.run(*argv[1:], f"train.max_steps={step + 4}", "train.resume_schedule=continue",
                      timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert int(float(run.data.tags["final.steps"])) == step + 4
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "FINISHED"


@pytest.mark.slow
def test_slurm_usr1_checkpoints_and_the_requeued_job_resumes(tmp_path: Path, shared_data_dir: Path,
                                                             train_cli) -> None:
    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "mlruns.db")
    run_dir = tmp_path / "run"
    args = _args(tmp_path, shared_data_dir, train_cli, uri, run_dir)
    # a SLURM job as sbatch sees it, minus scontrol (not installed here): the requeue fails
    env = train_cli.env(SLURM_JOB_ID="4242", PATH=str(Path(train_cli.cmd()[0]).parent) + ":/bin")
    with training(train_cli.cmd(*args), train_cli.repo, env) as proc:
        run_id = wait_for_steps(proc, run_dir, uri)
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGUSR1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["scalelab.stop_signal"] == "SIGUSR1"
    assert "scontrol requeue 4242" in run.data.tags["scalelab.requeue"]
    assert "failed" in run.data.tags["scalelab.requeue"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["signal"] == "SIGUSR1" and "failed" in summary["requeue"]
    step = ckpt_step(run_dir / "checkpoints" / "last.ckpt")
    assert step >= 3

    # what SLURM does after a requeue: the same command again, with SLURM_RESTART_COUNT=1
    args = [a for a in args if not a.startswith("train.max_steps=")] + [
        f"train.max_steps={step + 3}", "train.resume_schedule=continue"]  # shorter, so it ends
    r = train_cli.run(*args, env=dict(env, SLURM_RESTART_COUNT="1"), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = client.search_runs([run.info.experiment_id])
    assert [x.info.run_id for x in runs] == [run_id]  # the same run continued
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_every_step_is_logged_once_across_two_stops_and_two_resumes(
        tmp_path: Path, shared_data_dir: Path, train_cli) -> None:
    """SIGTERM -> resume -> SIGUSR1 -> resume: one MLflow run whose train/loss has a row for
    every step, exactly once (a stop must leave Lightning's counters where a resume continues
    the logging step without a gap)."""
    import os

    from mlflow.tracking import MlflowClient

    uri = sqlite_store(tmp_path / "mlruns.db")
    run_dir = tmp_path / "run"
    tests_dir = Path(__file__).resolve().parents[1]  # `tracking.signal_at_step` for the child
    args = [*_args(tmp_path, shared_data_dir, train_cli, uri, run_dir), "model.max_seq_len=32",
            "train.global_batch_size=4",
            "+callbacks.stop={_target_: tracking.signal_at_step.SignalAtStep}"]

    def attempt(signal_at: str, *extra: str) -> tuple[int, str]:
        env = train_cli.env(SCALELAB_TEST_SIGNAL_AT=signal_at, PYTHONPATH=os.pathsep.join(
            [str(tests_dir), os.environ.get("PYTHONPATH", "")]))
        with training(train_cli.cmd(*args, *extra), train_cli.repo, env) as proc:
            out, _ = proc.communicate(timeout=300)
        return proc.returncode, out

    code, out = attempt("3:SIGTERM")
    assert code == 143, out[-3000:]
    first = ckpt_step(run_dir / "checkpoints" / "last.ckpt")
    code, out = attempt(f"{first + 3}:SIGUSR1", "resume=true")
    assert code == 128 + signal.SIGUSR1, out[-3000:]
    second = ckpt_step(run_dir / "checkpoints" / "last.ckpt")
    assert second > first
    total = second + 3
    code, out = attempt("", "resume=true", f"train.max_steps={total}",
                        "train.resume_schedule=continue")
    assert code == 0, out[-3000:]

    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss"))
    assert steps == list(range(total)), (first, second, steps)
