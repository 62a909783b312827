"""Where runs are stored: the tracking URI, the artifact root, and a fast reachability probe."""

from __future__ import annotations

import contextlib
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from scalelab.data.files import locked
from scalelab.tracking.redact import redact


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


def probe(uri: str, timeout: float = 3.0) -> None:
    """Fail within ``timeout`` seconds if a tracking server does not answer.

    mlflow's own client retries with backoff for minutes before giving up, so a plain
    HTTP GET of /health (every ``mlflow server`` serves it) decides first.
    """
    if not is_remote(uri):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read(64)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403, 404):  # it answered: auth or a proxy without /health is fine
            return
        raise TrackingServerUnreachable(_unreachable(uri, f"HTTP {e.code} from {url}")) from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        reason = getattr(e, "reason", e)
        raise TrackingServerUnreachable(_unreachable(uri, f"{type(e).__name__}: {reason}")) from None


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
