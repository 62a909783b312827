"""What counts as a trained sweep point, stale RUNNING runs, and replaying a run folder's
pending calls: against a real MLflow SQLite store and real (dead and live) processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mlflow.tracking import MlflowClient
from tests.conftest import sqlite_store

from scalelab.scaling.collect import collect
from scalelab.tracking.recover import main as recover_main
from scalelab.tracking.recover import stale_runs
from scalelab.tracking.spool import PENDING_FILE
from scalelab.tracking.sweep import SweepParent, process_alive


def _dead_pid() -> tuple[str, str]:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    start = f"{psutil.Process(p.pid).create_time():.2f}"
    p.wait()
    return str(p.pid), start


def _tags(pid: str, start: str) -> dict[str, str]:
    return {"scalelab.host": socket.gethostname(), "scalelab.pid": pid, "scalelab.pid_start": start}


def test_only_finished_runs_with_a_finite_loss_are_done(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    parent = SweepParent.open(uri, "sweep_done", "done")
    c = parent.client
    cases = {"ok": ("FINISHED", 2.5), "nan": ("FINISHED", float("nan")),
             "none": ("FINISHED", None), "killed": ("KILLED", 2.4)}
    for name, (status, loss) in cases.items():
        run = c.create_run(parent.experiment_id, run_name=name, tags={
            "mlflow.parentRunId": parent.run_id, "sweep_point_id": name, "sweep_point": name})
        if loss is not None:
            c.log_metric(run.info.run_id, "final/val_loss", loss)
        c.set_terminated(run.info.run_id, status)
    kids = {k.name: k for k in parent.children()}
    assert {n for n, k in kids.items() if k.done} == {"ok"}
    got = collect(parent, curves=False)
    assert list(got.runs["point"]) == ["ok"]
    assert set(got.failed["point"]) == {"nan", "none", "killed"}
    assert "nan" in got.failed.set_index("point").loc["nan", "reason"]


def test_process_alive_and_stale_runs_are_marked(tmp_path: Path, capsys) -> None:
    me = psutil.Process()
    assert process_alive(_tags(str(me.pid), f"{me.create_time():.2f}"))
    dead = _dead_pid()
    assert not process_alive(_tags(*dead))
    assert not process_alive(_tags(str(me.pid), f"{me.create_time() - 100:.2f}"))  # PID reused
    assert process_alive({"scalelab.host": "elsewhere", "scalelab.pid": "1"})  # can't tell

    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("stale")
    gone = client.create_run(exp, run_name="gone", tags=_tags(*dead)).info.run_id
    live = client.create_run(exp, run_name="live",
                             tags=_tags(str(me.pid), f"{me.create_time():.2f}")).info.run_id
    assert [r.info.run_id for r in stale_runs(client)] == [gone]
    assert recover_main(["stale", "--tracking-uri", uri, "--mark"]) == 0
    assert "1 RUNNING run(s)" in capsys.readouterr().out
    assert client.get_run(gone).info.status == "KILLED"
    assert "ended without recording an end" in client.get_run(gone).data.tags["scalelab.stale"]
    assert client.get_run(live).info.status == "RUNNING"


def test_replay_sends_a_run_folders_pending_calls(tmp_path: Path) -> None:
    uri = sqlite_store(tmp_path / "mlruns.db")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("replay")).info.run_id
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "mlflow_run_id").write_text(run_id + "\n")
    now = int(time.time() * 1000)
    ops = [{"op": "batch", "metrics": [["train/loss", 3.0 - s / 10, now, s] for s in range(1, 6)],
            "params": [], "tags": [["k", "v"]]},
           {"op": "status", "status": "KILLED", "end_time": now}]
    (folder / PENDING_FILE).write_text("".join(json.dumps(o) + "\n" for o in ops) + '{"torn')
    assert recover_main(["replay", str(folder), "--tracking-uri", uri]) == 0
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["k"] == "v"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2, 3, 4, 5]
    assert not (folder / PENDING_FILE).exists()
