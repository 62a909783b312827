"""Start `scalelab-train` in a child that really receives the signals a test sends it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def default_signals() -> None:
    """preexec_fn: a shell without job control (CI, `cmd &`) starts children with SIGINT
    ignored; reset what the tests send to the defaults so the child sees them."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def training(cmd: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """The running child (text stdout+stderr pipe); killed in ``finally`` whatever happens."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=default_signals)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(Exception):
            proc.communicate(timeout=30)


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, uri: str, min_steps: int = 3,
                   timeout: float = 300) -> str:
    """Block until the run logged ``min_steps`` train/loss values; returns its MLflow run id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, proc.stdout.read()[-3000:] if proc.stdout else "exited"
        assert time.time() < deadline, "training did not start in time"
        rid = run_dir / "mlflow_run_id"
        if rid.is_file() and rid.read_text().strip():
            run_id = rid.read_text().strip()
            if len(client.get_metric_history(run_id, "train/loss")) >= min_steps:
                return run_id
        time.sleep(0.5)


def ckpt_step(path: Path) -> int:
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
