"""`make ui` / `python -m scalelab.tracking.ui`: the MLflow UI over the project's store.

It serves the same SQLite store and artifact folder that `scalelab-train` writes by default
(or $MLFLOW_TRACKING_URI's database when that is a local store), on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from pathlib import Path

from scalelab.tracking.root import repo_root


def _free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


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
        print(f"MLFLOW_TRACKING_URI={env_uri} already points at a server: open it in a browser.")
        return 0
    port = args.port if args.dry_run else _free_port(args.port)
    cmd = build_command(args.store, args.artifacts, args.host, port, args.workers)
    url = f"http://{args.host}:{port}"
    print(f"MLflow UI for {args.store}\n  artifacts: {args.artifacts}\n  open {url}  (Ctrl-C stops it)")
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    args.artifacts.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    # exec, not a child process: `kill <pid>` / Ctrl-C reach mlflow itself and free the port
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
