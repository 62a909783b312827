"""Sweeps and runs as real SLURM jobs (slurmctld + slurmd + slurmdbd), tracked by a real MLflow
server on PostgreSQL, all started by scripts/cluster_up.sh (conftest.py).

- the node crashes under a sweep (slurmd and the points' processes killed, slurmd started again):
  the sweep names the lost points and exits 1; the same command again queues them as a new job
  array that completes, and the runs nest under the sweep's parent on the server;
- one job is requeued by ``scontrol requeue``, then stopped by the pre-timeout signal (USR1,
  sent to the job step as ``--signal=USR1@N`` does), then cancelled: the MLflow run is the same
  run throughout, no step is logged twice or lost, and it ends KILLED;
- concurrent writers: every metric row reaches the PostgreSQL store.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from tests.conftest import REPO, session_data_dir
from tests.tracking.signal_helpers import default_signals, training

pytestmark = pytest.mark.slow


def _until(what: str, check, timeout: float = 240, proc: subprocess.Popen | None = None):
    """Poll ``check()`` until it returns something truthy (its value); fail after ``timeout``."""
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"the launcher exited ({proc.returncode}) before {what}:\n{out[-3000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _slurm(cluster, *args: str) -> str:
    r = subprocess.run(list(args), env=cluster.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return r.stdout


def _job_field(cluster, job: str, field: str) -> str:
    out = _slurm(cluster, "scontrol", "-o", "show", "job", job)
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith(field + "="))


def _restarted(cluster, job: str, restarts: int) -> bool:
    """The job runs again after its ``restarts``-th requeue. SLURM holds a requeued job back
    for about two minutes (Reason=BeginTime); like an admin, release it at once."""
    state = _job_field(cluster, job, "JobState")
    if _job_field(cluster, job, "Restarts") != str(restarts):
        return False
    if state == "PENDING" and _job_field(cluster, job, "Reason") == "BeginTime":
        _slurm(cluster, "scontrol", "update", f"JobId={job}", "StartTime=now")
    return state == "RUNNING"


def _sweep_command(sweep_dir: Path, experiment: str) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli.sweep", "sweep=cpu_tiny", "sweep.name=onslurm",
            "sweep.budgets=[1e10]", "sweep.sizes_per_budget=2", "sweep.fit=false",
            "sweep.hydra_launcher=slurm_cpu", f"sweep.output_dir={sweep_dir}",
            # jobs that start together on a loaded CI machine may wait for the server a while
            "logger.probe_timeout=60",
            f"paths.data_dir={session_data_dir()}", f"sweep.experiment_name={experiment}"]


def _lose_the_node(cluster, cmd: list[str], sweep_dir: Path, log: Path) -> tuple[str, str]:
    """Start the sweep; once both points run as jobs, crash the node under them (slurmd and
    the jobs' processes killed) and start slurmd again as cluster_up.sh does. SLURM records
    NODE_FAIL and requeues the jobs, held back for a while; the test, as an admin would,
    cancels them. Returns (the sweep's exit code and output, the job array)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=cluster.env(), stdout=out,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=default_signals)
    try:
        def array() -> str | None:
            folder = next((sweep_dir / "multirun").glob("*/.submitit"), None)
            return next((p.name for p in folder.iterdir() if p.is_dir() and "_" not in p.name),
                        None) if folder else None

        def running() -> list[str] | None:  # the tasks' own job ids, once both run
            out = _slurm(cluster, "squeue", "-h", "-t", "RUNNING", "-o", "%A %S", "-j", job)
            return out.split() if len(out.splitlines()) == 2 else None

        job = _until("the sweep to queue its job array", array, proc=proc)
        tasks = _until("both points to run", running, proc=proc)
        cluster.crash_node(tasks[0::2])
        # slurmctld treats a job missing from a restarted slurmd as lost only once it has run
        # for BatchStartTimeout (10 s) plus a message timeout (10 s): the node stays down that long
        started = max(time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S")) for t in tasks[1::2])
        time.sleep(max(0.0, started + 25 - time.time()))
        r = cluster.up()
        assert r.returncode == 0, r.stdout + r.stderr

        def every_lost_job_reported() -> bool:  # a job that ended before the crash is not lost
            ended = _slurm(cluster, "sacct", "-X", "-n", "-P", "-o", "State", "-j", job).split()
            return log.read_text().count("lost its node (NODE_FAIL); SLURM requeued it") == (
                2 - ended.count("COMPLETED"))

        _until("the sweep to report the points lost", every_lost_job_reported, proc=proc)
        _slurm(cluster, "scancel", job)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return f"exit code {proc.returncode}\n{log.read_text()}", job


def test_sweep_on_slurm_reports_points_lost_with_the_node_and_a_rerun_finishes_them(
        cluster, tmp_path: Path) -> None:
    sweep_dir, experiment = tmp_path / "sweep", f"slurm_{tmp_path.name}"
    cmd = _sweep_command(sweep_dir, experiment)
    # 1. the node is lost under both points: the sweep names them and why, and exits 1. On a
    #    loaded machine the small point may finish its run before the node goes: it is done,
    #    not lost, and only the other is reported
    with cluster.node(exclusive=True):
        out, lost_array = _lose_the_node(cluster, cmd, sweep_dir, tmp_path / "first.log")
    assert out.startswith("exit code 1"), out[-3000:]
    lost = re.findall(r"failed (\S+): SLURM job \S+ lost its node \(NODE_FAIL\); then "
                      r"CANCELLED; rerun the sweep", out)
    assert 1 <= len(lost) <= 2, out[-3000:]
    assert out.count("lost its node (NODE_FAIL); then CANCELLED; rerun the sweep") == 2 * len(lost)
    client = MlflowClient(cluster.tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    statuses = [r.info.status for r in client.search_runs([exp.experiment_id])]
    assert statuses.count("FINISHED") == 2 - len(lost), statuses
    assert set(statuses) - {"FINISHED"} <= {"FAILED", "KILLED"}, statuses
    # 2. the same command again finishes them, as one new submission that SLURM's accounting
    #    says completed: a job array, or a plain job where one point was lost (submitit submits
    #    a single job as such)
    r = subprocess.run(cmd, cwd=REPO, env=cluster.env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    arrays = [p.name for p in sweep_dir.glob("multirun/*/.submitit/*") if "_" not in p.name]
    (array,) = set(arrays) - {lost_array}
    states = _slurm(cluster, "sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", array).split()
    want = [f"{array}_{i}|COMPLETED" for i in range(len(lost))] if len(lost) > 1 else [
        f"{array}|COMPLETED"]
    assert sorted(states) == want, states
    # the parent and its children nest on the server: one FINISHED child per point, and the
    # runs the lost jobs had started closed KILLED, none left RUNNING
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [x for x in runs if "mlflow.parentRunId" not in x.data.tags]
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == len(children) + 1
    finished = [c for c in children if c.info.status == "FINISHED"]
    assert len(finished) == 2 and len({c.data.tags["sweep_point"] for c in finished}) == 2
    assert {c.info.status for c in children if c not in finished} <= {"KILLED"}
    assert {c.data.tags["sweep_name"] for c in children} == {"onslurm"}
    # the curves, read back from the server concurrently: every val/loss row of every child
    curves = pd.read_csv(sweep_dir / "curves.csv")
    for c in finished:
        want = sorted(m.step for m in client.get_metric_history(c.info.run_id, "val/loss"))
        assert sorted(curves[curves["run_id"] == c.info.run_id]["step"]) == want


def test_requeue_and_pre_timeout_signal_continue_one_run_and_scancel_is_killed(
        cluster, tmp_path: Path) -> None:
    client = MlflowClient(cluster.tracking_uri)
    multirun, run_dir = tmp_path / "multirun", tmp_path / "run"
    cmd = [sys.executable, "-m", "scalelab.cli.train", "--multirun", "hydra/launcher=slurm_cpu",
           "model=gpt2_tiny", "data=pystdlib", "data.max_bytes=200000", "tokenizer=byte",
           "model.max_seq_len=32", "train.global_batch_size=8", "train.max_steps=1000000",
           "train.val_every=100000", "train.val_batches=1", "trainer.log_every_n_steps=1",
           "callbacks.sample.enabled=false", "logger.log_checkpoint=false",
           "trainer.enable_progress_bar=false", "train.num_threads=1", "logger.probe_timeout=60",
           f"logger.experiment_name=requeue_{tmp_path.name}", f"paths.output_dir={run_dir}",
           f"paths.data_dir={session_data_dir()}", f"hydra.sweep.dir={multirun}"]
    job = None
    with cluster.node(exclusive=False), training(cmd, REPO, cluster.env()) as proc:
        try:
            job = _until("the job to be submitted", lambda: next(
                (p.name for p in (multirun / ".submitit").glob("*") if p.is_dir()), None)
                if (multirun / ".submitit").is_dir() else None, proc=proc)

            def run_id() -> str | None:
                rid = run_dir / "mlflow_run_id"
                return rid.read_text().strip() if rid.is_file() else None

            def steps() -> list[int]:
                return [m.step for m in client.get_metric_history(rid, "train/loss")]

            def running_past(n: int) -> bool:
                return (client.get_run(rid).info.status == "RUNNING" and len(steps()) > n + 2)

            rid = _until("the MLflow run", run_id, proc=proc)
            _until("a few steps", lambda: running_past(0), proc=proc)

            # 1. scontrol requeue: SIGTERM -> checkpoint, KILLED; SLURM starts the job again and
            #    it resumes the same run from last.ckpt
            _slurm(cluster, "scontrol", "requeue", job)
            _until("the requeued job to restart", lambda: _restarted(cluster, job, 1), proc=proc)
            n = len(steps())
            _until("the resumed run to log new steps", lambda: running_past(n), proc=proc)
            assert run_id() == rid
            assert client.get_run(rid).data.tags["scalelab.stop_signal"] == "SIGTERM"

            # 2. the pre-timeout signal (what --signal=USR1@90 sends to the job step): checkpoint,
            #    the run requeues its own job, which resumes it again
            _slurm(cluster, "scancel", "--signal=USR1", job)
            _until("the self-requeued job to restart", lambda: _restarted(cluster, job, 2),
                   proc=proc)
            n = len(steps())
            _until("the run to log steps after the second resume", lambda: running_past(n),
                   proc=proc)
            tags = client.get_run(rid).data.tags
            assert tags["scalelab.stop_signal"] == "SIGUSR1"
            assert tags["scalelab.requeue"].startswith(f"requeued SLURM job {job}"), tags

            # 3. scancel: the run is KILLED (never left RUNNING or FINISHED)
            _slurm(cluster, "scancel", job)
            _until("the run to be closed", lambda: client.get_run(rid).info.status != "RUNNING")
        finally:
            if job:
                subprocess.run(["scancel", job], env=cluster.env(), capture_output=True)
    run = client.get_run(rid)
    assert run.info.status == "KILLED"
    assert run.data.tags["scalelab.stop_signal"] == "SIGTERM"
    state = _until("sacct to record the cancel", lambda: _slurm(
        cluster, "sacct", "-X", "-n", "-P", "-o", "State", "-j", job).strip().startswith("CANCELLED"))
    assert state
    # three attempts, one run: every step logged once
    got = steps()
    assert len(got) == len(set(got)), sorted(x for x in got if got.count(x) > 1)
    missing = sorted(set(range(min(got), max(got) + 1)) - set(got))
    assert not missing, missing
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "KILLED"


WRITER = """
import sys
from pathlib import Path
from scalelab.tracking.run import Tracker
uri, exp, i, rows, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t = Tracker.start(uri, exp, f"writer{i}", {"writer": str(i)}, folder=Path(folder))
for step in range(rows):
    t.log_metrics({"a": step * 0.5, "b": float(i)}, step=step)
assert t.end("FINISHED")
"""


def test_concurrent_writers_lose_no_metric_row(cluster, tmp_path: Path) -> None:
    writers, rows = 8, 40
    exp = f"writers_{tmp_path.name}"
    procs = []
    for i in range(writers):
        (tmp_path / str(i)).mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WRITER, cluster.tracking_uri, exp, str(i), str(rows),
             str(tmp_path / str(i))], env=cluster.env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * writers, outs
    client = MlflowClient(cluster.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(exp).experiment_id])
    assert len(runs) == writers
    assert {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        for key in ("a", "b"):
            hist = client.get_metric_history(r.info.run_id, key)
            assert sorted(m.step for m in hist) == list(range(rows)), (r.info.run_name, key)
