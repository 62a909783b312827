"""`make ui` (python -m scalelab.tracking.ui) serves the store on 127.0.0.1 and prints its URL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest


def test_dry_run_prints_the_command(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "scalelab.tracking.ui", "--dry-run", "--store",
                        f"sqlite:///{tmp_path}/m.db", "--port", "5123"],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert r.returncode == 0, r.stderr
    assert "open http://127.0.0.1:5123" in r.stdout
    assert f"--backend-store-uri sqlite:///{tmp_path}/m.db" in r.stdout and "--host 127.0.0.1" in r.stdout


@pytest.mark.slow
def test_ui_serves_the_store(tmp_path: Path) -> None:
    from conftest import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scalelab.tracking.ui", "--port", str(port), "--store",
         f"sqlite:///{tmp_path}/m.db", "--artifacts", str(tmp_path / "arts")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "UI did not come up"
            time.sleep(0.5)
        # the server runs without MLflow's job runner (GenAI jobs): ~0.5 GB, not ~1.9 GB
        servers = _descendants(proc.pid)
        assert any(" server " in c for c in servers), servers
        assert not [c for c in servers if "huey" in c or "mlflow.server.jobs" in c], servers
        req = url + "/api/2.0/mlflow/experiments/search?max_results=10"
        with urllib.request.urlopen(req, timeout=60) as r:
            names = [e["name"] for e in json.load(r)["experiments"]]
        assert "Default" in names
        # killing the wrapper by PID (not its process group) stops the server and frees the port
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        deadline = time.time() + 30
        while _port_busy(port):
            assert time.time() < deadline, f"port {port} still held after the UI process exited"
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # any leftover worker of this process group
    assert f"open {url}" in out


def _descendants(pid: int) -> list[str]:
    """The command lines of every process below ``pid``."""
    lines = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that exits meanwhile
            lines.append(" ".join(child.cmdline()))
    return lines


def _port_busy(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_one_link_to_the_newest_experiment(tmp_path: Path, train_cli) -> None:
    """`make ui` prints one link: the runs of the experiment with the newest run, classic view."""
    from mlflow.tracking import MlflowClient

    store = train_cli.store(tmp_path / "m.db")
    client = MlflowClient(store)
    for name in ("older", "newer"):
        client.create_run(client.create_experiment(name, artifact_location=str(tmp_path / name)))
        time.sleep(0.01)  # distinct start times (milliseconds), in this order
    newer = client.get_experiment_by_name("newer").experiment_id
    r = subprocess.run([sys.executable, "-m", "scalelab.tracking.ui", "--dry-run", "--store", store,
                        "--port", "5123"], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert r.returncode == 0, r.stderr
    links = [w for w in r.stdout.split() if w.startswith("http://")]
    assert links == [f"http://127.0.0.1:5123/#/experiments/{newer}?workflowType=machine_learning"]
    assert "runs of newer, the newest experiment" in r.stdout and "older (#" in r.stdout
