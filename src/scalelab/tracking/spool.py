"""Tracking calls survive a tracking-server outage: kept in memory and on disk, replayed later.

While the server answers, every call goes straight through. When a call fails and the server's
``/health`` does not answer either, the run goes "offline": one warning line, and from then on
each call is appended to an in-memory list and to ``<run folder>/mlflow_pending.jsonl`` (one
JSON object per line) instead of blocking training. Every ``retry_s`` seconds the next call
checks ``/health`` (1 s timeout) and, once it answers, replays everything in order: one more
line says so. ``flush`` (at the end of the run) waits up to ``wait_s`` for the server; whatever
is still unsent then stays in the file, and ``python -m scalelab.tracking.recover replay
<run folder>`` or ``scalelab-train resume=true`` sends it later. Nothing is dropped silently.

A call that fails while the server is healthy (a real error: bad value, deleted run) is raised,
and so is any failure of a local store (SQLite/file): there is no outage to wait out.

Metric values sent to a tracking server go with MLflow's asynchronous logging
(``log_batch(synchronous=False)``): the request happens on MLflow's logging thread while
training goes on. A local store (SQLite, a folder) is written directly: the write costs the same
CPU on either thread, and MLflow's logging thread, once started, takes up to 1 s to stop at each
run's end (``set_terminated`` waits for it). At most one asynchronous batch is
in flight; it is waited for before the next one, before any other call (params, tags, texts,
artifacts, the status) and at ``flush``, so the calls keep their order and the status comes
last. A batch that failed because the server is down is kept like any other call; a real error
is raised at that wait.

Metric values are also sent at most every ``metrics_interval_s`` seconds: the first values go
out at once, later ones are held and sent together with the next values logged after the
interval, or before any other call and at ``flush``. Writing a batch costs about 11 ms of CPU
whatever its size (SQLite), on whichever thread does it; a small model logging every 10 steps
paid that on ~10 % of its steps. A SIGKILLed run loses at most the last interval's values; a
resume logs the steps after its checkpoint again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.async_logging.run_operations import RunOperations

from scalelab.tracking.redact import redact
from scalelab.tracking.store import TrackingServerUnreachable, is_remote, probe

log = logging.getLogger(__name__)
PENDING_FILE = "mlflow_pending.jsonl"  # <run folder>/mlflow_pending.jsonl
MAX_METRICS_PER_BATCH = 1000  # mlflow's log_batch limits
MAX_PARAMS_PER_BATCH = 100


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:160]}"


class Spool:
    """The Tracker's way to MLflow for one run: direct while the server is up, buffered while not."""

    def __init__(self, client: MlflowClient, run_id: str, tracking_uri: str,
                 folder: Path | None = None, retry_s: float = 5.0,
                 metrics_interval_s: float = 0.0) -> None:
        self.client = client
        self.metrics_interval_s = float(metrics_interval_s)
        self.held: list[list[Any]] = []  # metric rows waiting for the interval to pass
        self._metrics_sent_at: float | None = None
        self.run_id = run_id
        self.tracking_uri = tracking_uri
        self.path = (folder / PENDING_FILE) if folder is not None else None
        self.retry_s = retry_s
        self.pending: list[dict[str, Any]] = []
        self.offline_since: float | None = None
        self._last_try = 0.0
        self._lock = threading.RLock()
        # the metric batch MLflow is still writing, with the call that made it (kept on failure)
        self._in_flight: tuple[dict[str, Any], RunOperations] | None = None

    # --- the calls the Tracker makes -------------------------------------------------------
    def log_batch(self, metrics: Iterable[Metric] = (), params: Iterable[Param] = (),
                  tags: Iterable[RunTag] = ()) -> None:
        op = {"op": "batch",
              "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
              "params": [[p.key, p.value] for p in params],
              "tags": [[t.key, t.value] for t in tags]}
        if op["params"] or op["tags"]:
            self.call(op)
        elif op["metrics"]:
            with self._lock:
                self.held.extend(op["metrics"])
                sent_at = self._metrics_sent_at
                if sent_at is None or time.monotonic() - sent_at >= self.metrics_interval_s:
                    self.send_held()

    def send_held(self) -> None:
        """Send the held metric values now (kept like any call if the server is away)."""
        with self._lock:
            if self.held:  # the interval counts from the last metric values sent, not other calls
                rows, self.held = self.held, []
                self._metrics_sent_at = time.monotonic()
                self._send_metrics({"op": "batch", "metrics": rows, "params": [], "tags": []})

    def _send_metrics(self, op: dict[str, Any]) -> None:
        """Hand metric values to MLflow's logging thread (kept like any call while offline)."""
        self.wait()
        if self.offline or not is_remote(self.tracking_uri):
            self._call(op)
            return
        metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in op["metrics"]]
        running = self.client.log_batch(self.run_id, metrics=metrics, synchronous=False)
        if running is not None:
            self._in_flight = (op, running)

    def wait(self) -> None:
        """Wait until MLflow has written the metric batch in flight; if the server is down,
        keep that batch for replay. A real error (a bad value, a deleted run) is raised."""
        with self._lock:
            if self._in_flight is None:
                return
            op, running = self._in_flight
            failure: Exception | None = None
            try:
                running.wait()
            except Exception as e:
                failure = e
            # cleared only here: a signal that interrupts the wait leaves it for end() to wait on
            self._in_flight = None
            if failure is None:
                return
            if not self._server_down():
                raise failure
            if not self.offline:
                self._go_offline(failure)
            self._keep(op)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.call({"op": "text", "text": text, "file": artifact_file})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.call({"op": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def set_terminated(self, status: str) -> None:
        self.call({"op": "status", "status": status, "end_time": int(time.time() * 1000)})

    @property
    def offline(self) -> bool:
        return self.offline_since is not None

    # --- machinery ---------------------------------------------------------------------------
    def call(self, op: dict[str, Any]) -> None:
        with self._lock:
            self.send_held()  # held metric values first: the calls keep their order
            self.wait()
            self._call(op)

    def _call(self, op: dict[str, Any]) -> None:
        with self._lock:
            if not self.offline:
                try:
                    self._apply(op)
                    return
                except Exception as e:
                    if not self._server_down():
                        raise
                    self._go_offline(e)
            self._keep(op)
            self.try_replay()

    def _server_down(self) -> bool:
        if not is_remote(self.tracking_uri):
            return False
        try:
            probe(self.tracking_uri, timeout=2.0)
        except TrackingServerUnreachable:
            return True
        return False

    def _go_offline(self, e: BaseException) -> None:
        self.offline_since = self._last_try = time.time()
        where = f" and in {self.path}" if self.path else ""
        log.warning("MLflow server %s is unreachable (%s): training goes on; metrics are kept in "
                    "memory%s and sent when it is back", redact(self.tracking_uri), _short(e), where)

    def _keep(self, op: dict[str, Any]) -> None:
        self.pending.append(op)
        if self.path is None:
            return
        try:
            with self.path.open("a") as fh:
                fh.write(json.dumps(op) + "\n")
        except OSError as e:  # the memory copy still holds it; say so once
            if not getattr(self, "_disk_warned", False):
                self._disk_warned = True
                log.warning("could not write %s (%s): pending metrics are kept in memory only",
                            self.path, _short(e))

    def try_replay(self, force: bool = False) -> bool:
        """Send what is pending if the server answers again; True when nothing is left."""
        with self._lock:
            if not self.pending:
                return True
            now = time.time()
            if not force and now - self._last_try < self.retry_s:
                return False
            self._last_try = now
            if self._server_down():
                return False
            self.pending = coalesce(self.pending)  # ~1000 values per request, not one step
            sent = 0
            try:
                while self.pending:
                    self._apply(self.pending[0])
                    sent += len(self.pending.pop(0).get("metrics", ()))
            except Exception as e:
                self._rewrite()
                log.debug("replay stopped: %s", _short(e))
                return False
            self._rewrite()
            since = self.offline_since or now
            self.offline_since = None
            log.warning("MLflow server %s is back after %.0f s: sent %d buffered metric value(s)",
                        redact(self.tracking_uri), time.time() - since, sent)
            return True

    def flush(self, wait_s: float) -> bool:
        """Replay, waiting up to ``wait_s`` seconds for the server; True when nothing is left."""
        deadline = time.time() + wait_s
        self.send_held()
        self.wait()
        while not self.try_replay(force=True):
            if time.time() >= deadline:
                return False
            time.sleep(min(self.retry_s, max(0.1, deadline - time.time())))
        return True

    def _rewrite(self) -> None:
        """The file mirrors ``pending`` (removed when empty)."""
        if self.path is None:
            return
        with contextlib.suppress(OSError):
            if not self.pending:
                self.path.unlink(missing_ok=True)
                return
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(op) + "\n" for op in self.pending))
            tmp.replace(self.path)

    def _apply(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "batch":
            apply_batch(self.client, self.run_id, op)
        elif kind == "text":
            self.client.log_text(self.run_id, op["text"], op["file"])
        elif kind == "artifact":
            self.client.log_artifact(self.run_id, op["path"], op["artifact_path"])
        elif kind == "status":
            self.client.set_terminated(self.run_id, op["status"], end_time=op.get("end_time"))
        else:
            raise ValueError(f"{self.path}: unknown pending operation {kind!r}")


def apply_batch(client: MlflowClient, run_id: str, op: dict[str, Any]) -> None:
    """One pending batch, split into chunks MLflow accepts."""
    metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in op.get("metrics", ())]
    params = [Param(k, v) for k, v in op.get("params", ())]
    tags = [RunTag(k, v) for k, v in op.get("tags", ())]
    for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=params[i:i + MAX_PARAMS_PER_BATCH])
    if tags:
        client.log_batch(run_id, tags=tags)
    for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])


def coalesce(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent metric/param/tag batches merged into one (order kept; apply_batch chunks it)."""
    out: list[dict[str, Any]] = []
    for op in ops:
        prev = out[-1] if out else None
        if (op["op"] == "batch" and prev is not None and prev["op"] == "batch"
                and len(prev["metrics"]) + len(op["metrics"]) <= MAX_METRICS_PER_BATCH
                and len(prev["tags"]) + len(op["tags"]) <= MAX_PARAMS_PER_BATCH):
            out[-1] = {"op": "batch", "metrics": prev["metrics"] + op["metrics"],
                       "params": prev["params"] + op["params"], "tags": prev["tags"] + op["tags"]}
        else:
            out.append(op)
    return out


def read_pending(folder: Path) -> list[dict[str, Any]]:
    """The operations a run folder still owes its MLflow run (a torn last line is skipped)."""
    path = folder / PENDING_FILE
    if not path.is_file():
        return []
    ops = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            ops.append(json.loads(line))
    return ops


__all__ = ["PENDING_FILE", "Spool", "apply_batch", "read_pending"]
