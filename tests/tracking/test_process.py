"""The tracking process: a real worker process, a real SQLite store, real signals."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from tests.conftest import REPO, sqlite_store

from scalelab.tracking.process import RemoteTracker, TrackingProcess, TrackingProcessGone


def _start(uri: str, tmp: Path, **kw: object) -> RemoteTracker:
    return RemoteTracker.start(TrackingProcess(uri), tracking_uri=uri, experiment_name="unit",
                               run_name="r", tags={"k": "v"}, artifact_root=str(tmp / "a"), **kw)


def _wait_exit(proc: subprocess.Popen | int, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if isinstance(proc, int):
            try:
                os.kill(proc, 0)
            except ProcessLookupError:
                return
        elif proc.poll() is not None:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {proc} did not exit in {timeout} s")


def test_a_run_recorded_through_the_tracking_process(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)
    first = _start(uri, tmp_path)
    with first.status_guard():
        first.log_params({"lr": 0.1, "none": None})
        logger = first.lightning_logger()
        logger.log_metrics({"train/loss": 3.0, "epoch": 0, "bad key!": 1.0}, step=1)
        logger.log_metrics({"train/loss": 2.0}, step=2)
        logger.experiment.set_tag(first.run_id, "scalelab.stopped_early", "why")
        first.log_text("hello", "notes/hello.txt")
    first.set_tags({"after_end": "yes"})  # why a run stopped is tagged after its status
    first.close()
    assert first.process.proc.returncode == 0
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "none": "None"}
    assert set(run.data.metrics) == {"train/loss", "bad key"}  # MLflow's name rule, no epoch
    assert run.data.tags["scalelab.stopped_early"] == "why" and run.data.tags["after_end"] == "yes"
    assert run.data.tags["scalelab.pid"] == str(os.getpid())  # the training process, not the worker
    assert [a.path for a in client.list_artifacts(first.run_id, "notes")] == ["notes/hello.txt"]

    # a resume: steps already logged are skipped; the worker's warning reaches our logging
    again = _start(uri, tmp_path, resume_run_id=first.run_id)
    assert again.resumed and again.skip_until == {"train/loss": 2, "bad key": 1}
    with caplog.at_level(logging.WARNING), again.status_guard():
        again.log_params({"lr": 0.2})
        logger = again.lightning_logger()
        logger.log_metrics({"train/loss": 9.0}, step=2)
        logger.log_metrics({"train/loss": 1.0}, step=3)
    again.close()
    assert any("already logged as 0.1" in r.getMessage() for r in caplog.records)
    hist = sorted((m.step, m.value) for m in client.get_metric_history(first.run_id, "train/loss"))
    assert hist == [(1, 3.0), (2, 2.0), (3, 1.0)]


def test_errors_keep_their_class_and_close_the_process(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    idle = TrackingProcess(uri)  # a config error after the spawn: no run, nothing to wait for
    t0 = time.monotonic()
    idle.close()
    assert idle.proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 5
    process = TrackingProcess(uri)
    with pytest.raises(RuntimeError, match="is not in"):
        RemoteTracker.start(process, tracking_uri=uri, experiment_name="unit", run_name="r",
                            tags={}, resume_run_id="0" * 32)
    assert process.proc.returncode == 0  # nothing left running

    tracker = _start(uri, tmp_path)
    with pytest.raises(ValueError, match="unknown request"):
        tracker.process.call("no_such_call")
    killed = _start(uri, tmp_path)
    with pytest.raises(KeyboardInterrupt), killed.status_guard():
        raise KeyboardInterrupt
    assert MlflowClient(uri).get_run(killed.run_id).info.status == "KILLED"
    tracker.end("FAILED")
    for t in (killed, tracker):
        t.close()
        assert t.process.proc.returncode == 0


def test_a_lost_tracking_process_is_one_clear_error(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    tracker = _start(uri, tmp_path)
    tracker.process.proc.kill()
    tracker.process.proc.wait()
    with pytest.raises(TrackingProcessGone, match=r"was killed by SIGKILL"):
        tracker.log_metrics({"x": 1.0}, step=1)
    with caplog.at_level(logging.WARNING):
        assert tracker.end("FAILED") is True  # recorded from here, never raised
    assert any("recording status FAILED" in r.getMessage() for r in caplog.records)
    assert MlflowClient(uri).get_run(tracker.run_id).info.status == "FAILED"


ORPHAN = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from scalelab.tracking.process import RemoteTracker, TrackingProcess
uri = {uri!r}
tracker = RemoteTracker.start(TrackingProcess(uri), tracking_uri=uri, experiment_name="unit",
                              run_name="orphan", tags={{}}, metrics_interval_s=3600.0)
logger = tracker.lightning_logger()
for step in range(1, 6):
    logger.log_metrics({{"train/loss": 1.0 / step}}, step=step)
print(tracker.run_id, tracker.process.proc.pid, "mlflow" in sys.modules, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sigkilled_training_process_loses_no_held_metric_values(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    script = ORPHAN.format(repo=str(REPO / "src"), uri=uri)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    run_id, worker_pid, mlflow_here = out.split()
    assert mlflow_here == "False"  # the training side never imported mlflow
    _wait_exit(int(worker_pid))  # the worker saw its pipe close and exited
    client = MlflowClient(uri)
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert steps == [1, 2, 3, 4, 5]  # 2-5 were held for the interval; sent on the way out
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"  # as before: recover finds it by its pid tags
    assert run.data.tags["scalelab.pid"] == str(proc.pid)


@pytest.mark.slow
def test_scalelab_train_never_imports_mlflow_and_records_the_run(tmp_path: Path,
                                                                 train_cli) -> None:
    tiny = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
            "train.global_batch_size=4", "train.val_batches=1", "callbacks.sample.enabled=false",
            "logger.log_checkpoint=false", "data.max_bytes=200000", "train.max_steps=2")
    probe = ("import atexit, sys; "
             "atexit.register(lambda: print('MLFLOW_IMPORTED', 'mlflow' in sys.modules)); "
             "from scalelab.cli.train import main; sys.argv[0] = 'scalelab-train'; main()")
    uri = sqlite_store(tmp_path / "mlruns.db")
    r = subprocess.run([sys.executable, "-c", probe, *tiny, *train_cli.isolated(tmp_path),
                        f"logger.tracking_uri={uri}"], cwd=REPO, env=train_cli.env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MLFLOW_IMPORTED False" in r.stdout, r.stdout[-2000:]
    summary = json.loads(next((tmp_path / "outputs").glob("*/*/summary.json")).read_text())
    run = MlflowClient(uri).get_run(summary["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["n_layers"] == "1"
    assert run.data.metrics["val/loss"] > 0


@pytest.mark.slow
def test_a_killed_tracking_process_fails_the_run_in_one_line(tmp_path: Path, shared_data_dir: Path,
                                                             train_cli) -> None:
    import psutil
    from tests.tracking.signal_helpers import training, wait_for_steps

    uri = sqlite_store(tmp_path / "mlruns.db")
    run_dir = tmp_path / "run"
    args = ["model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=12",
            f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "train.max_steps=100000",
            "train.val_every=1000", "trainer.log_every_n_steps=1", "logger.metrics_interval_s=0",
            "callbacks.sample.enabled=false", "optim.warmup_steps=1", "logger.log_checkpoint=false",
            f"paths.output_dir={run_dir}", *train_cli.isolated(tmp_path, tracking_uri=uri)]
    with training(train_cli.cmd(*args), train_cli.repo, train_cli.env()) as proc:
        run_id = wait_for_steps(proc, run_dir, uri)
        workers = [c for c in psutil.Process(proc.pid).children()
                   if "scalelab.tracking.worker" in " ".join(c.cmdline())]
        assert len(workers) == 1
        workers[0].kill()  # the OOM killer's choice, say
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: the MLflow tracking process (pid {workers[0].pid}) was killed by "
                      "SIGKILL"], out[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "FAILED"
    assert MlflowClient(uri).get_run(run_id).info.status == "FAILED"  # recorded all the same


# --- a multirun's jobs share one tracking process ---------------------------------------------
def _job(uri: str, name: str, x: float, fail: bool = False) -> tuple[TrackingProcess, str]:
    """One multirun job's tracking: a run that logs ``x`` and ends FINISHED, or FAILED."""
    with TrackingProcess.for_run(uri, keep_for_next=True) as process:
        tracker = RemoteTracker.start(process, tracking_uri=uri, experiment_name="unit",
                                      run_name=name, tags={})
        try:
            with tracker.status_guard():
                tracker.log_metrics({"x": x}, step=1)
                if fail:
                    raise ValueError("the job fails")
        except ValueError:
            pass
    return process, tracker.run_id


def test_a_kept_process_serves_the_next_run_and_only_an_ended_one_is_kept(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)
    first, finished = _job(uri, "first", 1.0)
    assert first.proc.poll() is None  # kept, alive
    second, failed = _job(uri, "second", 2.0, fail=True)
    assert second is first and first.proc.poll() is None  # a failed run ended too: kept again
    for run_id, status, x in ((finished, "FINISHED", 1.0), (failed, "FAILED", 2.0)):
        run = client.get_run(run_id)
        assert run.info.status == status and run.data.metrics == {"x": x}

    # a run left open is never handed on: the process closes, the run stays RUNNING
    with TrackingProcess.for_run(uri, keep_for_next=True) as again:
        assert again is first
        open_run = RemoteTracker.start(again, tracking_uri=uri, experiment_name="unit",
                                       run_name="open", tags={})
    assert again.proc.returncode == 0
    assert client.get_run(open_run.run_id).info.status == "RUNNING"
    with TrackingProcess.for_run(uri, keep_for_next=True) as fresh:
        assert fresh is not first
    # another store gets its own process, and the kept one is closed
    other = sqlite_store(tmp_path / "other.db")
    with TrackingProcess.for_run(other) as single:
        assert single is not fresh and single.tracking_uri == other
    assert fresh.proc.returncode is not None and single.proc.returncode is not None


def test_a_process_refuses_a_second_run_while_one_is_open(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    tracker = _start(uri, tmp_path)
    with pytest.raises(RuntimeError, match=f"run {tracker.run_id} is still open"):
        tracker.process.call("start", tracking_uri=uri, experiment_name="unit", run_name="2nd",
                             tags={})
    assert not tracker.process.reusable
    tracker.end()
    assert tracker.process.reusable
    tracker.close()
    assert not tracker.process.reusable


KEPT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from scalelab.tracking.process import RemoteTracker, TrackingProcess
uri = {uri!r}
with TrackingProcess.for_run(uri, keep_for_next=True) as process:
    tracker = RemoteTracker.start(process, tracking_uri=uri, experiment_name="unit", run_name="k",
                                  tags={{}})
    tracker.end()
print(process.proc.pid, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_kept_process_exits_with_its_training_process(tmp_path: Path, how: str) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    script = textwrap.dedent(KEPT.format(repo=str(REPO / "src"), uri=uri))
    proc = subprocess.Popen([sys.executable, "-c", script, how], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (-signal.SIGKILL if how == "kill" else 0)
    _wait_exit(int(out.split()[0]))  # closed at exit, or saw its pipe close: nothing left behind
