"""One writer per run folder and per sweep folder: a second command is refused in one line that
names the holder's host and PID; the lock dies with its process (a SIGKILLed run can resume)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import sqlite_store

from scalelab.data.files import LOCK_FILE, FolderBusy, exclusive_folder

from .signal_helpers import training

pytestmark = pytest.mark.slow


def test_a_second_resume_of_a_running_run_is_refused_and_a_killed_one_frees_it(
        tmp_path: Path, shared_data_dir: Path, train_cli) -> None:
    run = tmp_path / "run"
    common = ["model=gpt2_tiny", "data=shakespeare", "tokenizer=char", "train.global_batch_size=4",
              f"data.path={shared_data_dir / 'tinyshakespeare.txt'}", "train.max_steps=100000",
              "train.val_every=1000", "callbacks.sample.enabled=false", f"paths.output_dir={run}",
              *train_cli.isolated(tmp_path)]
    with training(train_cli.cmd(*common), train_cli.repo, train_cli.env()) as first:
        lock = run / LOCK_FILE  # the holder writes its PID once it holds the lock
        while not (lock.is_file() and f'"pid": {first.pid}' in lock.read_text()):
            assert first.poll() is None, first.communicate()[0][-3000:]
            time.sleep(0.1)
        second = train_cli.run(*common, "resume=true", timeout=300)
        assert second.returncode == 2, second.stderr[-3000:]
        line = second.stderr.strip()
        assert "\n" not in line and "Traceback" not in line, line
        assert f"PID {first.pid} on host {socket.gethostname()}" in line, line
        assert "run folder" in line and str(run) in line
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    # the kernel dropped the dead process's lock: the next command may write into the folder
    with exclusive_folder(run, "run folder"):
        pass
    assert not (run / ".hydra.pending").exists()


def test_a_second_sweep_of_the_same_name_is_refused(tmp_path: Path, train_cli) -> None:
    sweep_dir = tmp_path / "sweeps" / "twin"
    env = dict(train_cli.env(), SCALELAB_ROOT=str(tmp_path),
               MLFLOW_TRACKING_URI=sqlite_store(tmp_path / "mlruns.db"))
    with exclusive_folder(sweep_dir, "sweep folder"):  # a live first sweep: this process
        with pytest.raises(FolderBusy, match=f"PID {os.getpid()} on host"), \
                exclusive_folder(sweep_dir, "sweep folder"):
            pass
        r = subprocess.run([sys.executable, "-m", "scalelab.cli.sweep", "sweep=cpu_tiny",
                            "sweep.name=twin", f"paths.data_dir={train_cli.data_dir()}"],
                           env=env, cwd=train_cli.repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"sweep folder {sweep_dir} is in use by PID {os.getpid()} on host" in r.stderr
    assert not (tmp_path / "mlruns.db").exists() or "twin" not in (tmp_path / "mlruns.db").read_bytes().decode("latin-1")
