"""Where runs are stored: the tracking URI, the artifact root, and a fast reachability probe."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from scalelab.data.files import locked
from scalelab.tracking.redact import redact

log = logging.getLogger(__name__)


class TrackingServerUnreachable(RuntimeError):
    """The tracking server did not answer the start-up probe."""


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def resolve_tracking_uri(uri: str | None, root: Path) -> str:
    """The explicit URI, else $MLFLOW_TRACKING_URI, else the embedded SQLite store in the repo."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlruns.db'}"
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        db.parent.mkdir(parents=True, exist_ok=True)
    elif not is_remote(uri) and "://" not in uri:
        # A bare folder: mlflow's file store. Make it absolute so cwd never matters.
        uri = str(Path(uri).expanduser().resolve())
    return uri


@contextlib.contextmanager
def sqlite_init_lock(uri: str) -> Iterator[None]:
    """Serialize the first use of a SQLite store across processes.

    MLflow creates and migrates the schema of a new SQLite file on first use; two parallel
    sweep jobs (joblib, submitit_local) doing that at once fail with
    "table _alembic_tmp_... already exists". A file lock next to the database orders them.
    """
    if not uri.startswith("sqlite:///"):
        yield
        return
    with locked(Path(uri[len("sqlite:///"):] + ".lock")):
        yield


def experiment_artifact_location(uri: str, artifact_root: str | None, name: str) -> str | None:
    """Artifact folder for a NEW experiment in a local store.

    Without it mlflow uses ``./mlruns`` relative to the current directory, so runs started from
    different folders would scatter their artifacts. A server decides this itself (None).
    """
    if is_remote(uri) or not artifact_root:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "default"
    path = Path(artifact_root).expanduser().resolve() / safe
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


# logger.probe_timeout's default: three of the per-request timeouts scalelab gives MLflow's
# client (MLFLOW_HTTP_REQUEST_TIMEOUT=10, remote_env_defaults); tens of jobs that start
# together on one server can keep /health waiting for seconds
PROBE_TIMEOUT_S = 30.0
PROBE_ATTEMPT_S = 10.0  # one /health request; a slow answer is retried until the deadline


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail within ``timeout`` seconds if a tracking server does not answer.

    mlflow's own client retries with backoff for minutes before giving up, so a plain
    HTTP GET of /health (every ``mlflow server`` serves it) decides first. A server that is
    slow (the request times out, or it answers 5xx while busy) is asked again with backoff
    until ``timeout``; nothing listening at the address (connection refused, unknown host) is
    a wrong or dead URI and fails at once.
    """
    if not is_remote(uri):
        return
    url = uri.rstrip("/") + "/health"
    deadline = time.monotonic() + timeout
    pause = 0.5
    while True:
        left = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=max(0.1, min(left, PROBE_ATTEMPT_S))) as resp:
                resp.read(64)
            return
        except urllib.error.HTTPError as e:
            if e.code in (401, 403, 404):  # it answered: auth or a proxy without /health is fine
                return
            why, busy = f"HTTP {e.code} from {url}", e.code >= 500
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            why = f"{type(e).__name__}: {reason}"
            # a timeout or a dropped connection: a server that is there but busy
            busy = isinstance(reason, (TimeoutError, ConnectionResetError)) or isinstance(
                e, (TimeoutError, ConnectionResetError))
        left = deadline - time.monotonic()
        if not busy or left <= pause:
            raise TrackingServerUnreachable(_unreachable(uri, why)) from None
        log.warning("tracking server %s is slow to answer (%s); asking again for up to %.0f s "
                    "(logger.probe_timeout)", redact(uri), why, left)
        time.sleep(pause)
        pause = min(pause * 2, 4.0)


def _unreachable(uri: str, why: str) -> str:
    src = "logger.tracking_uri"
    if os.environ.get("MLFLOW_TRACKING_URI") == uri:
        src = "$MLFLOW_TRACKING_URI"
    return (
        f"MLflow tracking server {redact(uri)} ({src}) is unreachable: {why}. Start it (e.g. "
        f"`mlflow server --host 127.0.0.1 --port PORT`), point {src} at a running server, "
        "unset it to use the embedded store (sqlite:///<repo>/mlruns.db), or pass logger=none."
    )


def remote_env_defaults() -> None:
    """Give up on a dead server after one retry (a few seconds, not minutes): the Tracker's
    spool then buffers the calls and replays them when it is back (overridable)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
