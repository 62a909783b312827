"""`make ui` / `python -m scalelab.tracking.ui`: the MLflow UI over the project's store.

It serves the same SQLite store and artifact folder that `scalelab-train` writes by default
(or $MLFLOW_TRACKING_URI's database when that is a local store), on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from scalelab.paths import repo_root
from scalelab.tracking.redact import redact

# a sweep's saved view (tracking/ui_view.py writes it): the tag MLflow's UI reads for
# ?viewStateShareKey=<key> (the view its "Share" button saves)
SWEEP_VIEW_KEY = "scalelab_sweep"
SWEEP_VIEW_TAG = "mlflow.sharedViewState." + SWEEP_VIEW_KEY

# MLflow's server also starts a job runner (huey consumers) for its GenAI jobs, which scalelab
# never submits. Off, a one-worker server holds 2 processes and ~0.5 GB instead of 10 and
# ~1.9 GB, and idles at ~0 CPU instead of about a quarter of a core (docs/everyday.md).
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def _free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    """``host`` is only reachable from this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


ML_VIEW = "workflowType=machine_learning"  # the UI's model-training mode (not GenAI)


def _experiments(store: str) -> list[tuple[str, str, bool]]:
    """(id, name, has a sweep view) of the active experiments holding runs in a local SQLite
    store, the one with the newest run first ([] if none)."""
    import sqlite3

    path = store.removeprefix("sqlite:///")
    if not store.startswith("sqlite:///") or not Path(path).is_file():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute(
                "SELECT e.experiment_id, e.name, MAX(r.start_time) AS newest, EXISTS (SELECT 1 "
                "FROM experiment_tags t WHERE t.experiment_id = e.experiment_id AND t.key = ?) "
                "FROM experiments e JOIN runs r ON r.experiment_id = e.experiment_id WHERE "
                "e.lifecycle_stage = 'active' GROUP BY e.experiment_id, e.name "
                "ORDER BY newest DESC", (SWEEP_VIEW_TAG,)).fetchall()
    except sqlite3.Error:
        return []
    return [(str(i), str(n), bool(v)) for i, n, _, v in rows]


def experiment_url(base: str, experiment_id: str, sweep_view: bool = False) -> str:
    """The experiment's runs table in the model-training view (not MLflow's GenAI pages); a
    sweep's opens on its saved view (tracking/ui_view.py: the points, val loss, N, D, C)."""
    if sweep_view:  # straight to the Runs tab: the redirect from the experiment drops the key
        return f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={SWEEP_VIEW_KEY}&{ML_VIEW}"
    return f"{base}/#/experiments/{experiment_id}?{ML_VIEW}"


def build_command(store: str, artifacts: Path, host: str, port: int, workers: int) -> list[str]:
    mlflow_bin = (shutil.which("mlflow", path=str(Path(sys.executable).parent))
                  or shutil.which("mlflow") or "mlflow")
    return [
        mlflow_bin, "server",
        "--backend-store-uri", store,
        "--artifacts-destination", str(artifacts),
        "--host", host, "--port", str(port),
        "--workers", str(workers),
    ]


def server_env() -> dict[str, str]:
    """The environment for ``mlflow server``: ours, with :data:`SERVER_ENV` where it is unset."""
    return {**SERVER_ENV, **os.environ}


def main(argv: list[str] | None = None) -> int:
    root = repo_root()
    ap = argparse.ArgumentParser(prog="python -m scalelab.tracking.ui", description=__doc__)
    env_uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    default_store = env_uri if env_uri.startswith("sqlite:") else f"sqlite:///{root / 'mlruns.db'}"
    ap.add_argument("--store", default=default_store, help="backend store URI (default: %(default)s)")
    ap.add_argument("--artifacts", type=Path, default=root / "mlartifacts",
                    help="artifact folder (default: %(default)s)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000, help="first port to try (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true", help="print the command and exit")
    args = ap.parse_args(argv)

    if env_uri.startswith(("http://", "https://")):
        print(f"MLFLOW_TRACKING_URI={redact(env_uri)} already points at a server: open it in a browser.")
        return 0
    if not is_loopback(args.host):
        print(f"warning: --host {args.host} serves the MLflow UI beyond this machine, and it has no "
              "authentication: whoever reaches the port can read, change and delete every run. "
              "Keep --host 127.0.0.1 and use an SSH tunnel (ssh -L PORT:127.0.0.1:PORT host).",
              file=sys.stderr)
    port = args.port if args.dry_run else _free_port(args.port)
    cmd = build_command(args.store, args.artifacts, args.host, port, args.workers)
    url = f"http://{args.host}:{port}"
    print(f"MLflow UI for {redact(args.store)}\n  artifacts: {args.artifacts}")
    experiments = _experiments(args.store)
    if experiments:
        # one link, to the runs of the newest experiment: MLflow 3.17 opens on its GenAI
        # landing page, and an experiment in GenAI mode, unless the URL says otherwise
        exp_id, name, sweep_view = experiments[0]
        print(f"  open {experiment_url(url, exp_id, sweep_view)}  (runs of {name}, the newest "
              "experiment; Ctrl-C stops it)")
        if len(experiments) > 1:
            print("  other experiments: " + ", ".join(f"{n} (#{i})" for i, n, _ in experiments[1:])
                  + "  (the Experiments list, or the id in the link)")
    else:
        print(f"  open {url}  (Ctrl-C stops it)")
    if args.dry_run:
        env = server_env()
        print(" ".join(f"{k}={env[k]}" for k in SERVER_ENV), redact(" ".join(cmd)))
        return 0
    args.artifacts.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    return serve(cmd)


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if this wrapper dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)


def serve(cmd: list[str], grace: float = 10.0) -> int:
    """Run ``cmd`` in its own process group and take the whole group down with this process.

    Not a plain exec: mlflow 3.17's `mlflow server` forwards SIGTERM to uvicorn but then does
    not exit while a job runner lingers (when one is on). Here Ctrl-C, SIGTERM or SIGHUP to THIS
    pid reach every server process, and whatever is still alive ``grace`` seconds later is
    killed, so `kill <pid of make ui>` always frees the port.
    """
    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent,
                            env=server_env())
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stopping.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    deadline = None
    while True:
        try:  # short waits: a signal handler cannot interrupt one long wait (PEP 475)
            rc = proc.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            if stopping and deadline is None:
                deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() > deadline:
                rc = -signal.SIGKILL
                break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (job runner, workers)
    return 0 if stopping else rc


if __name__ == "__main__":
    sys.exit(main())
