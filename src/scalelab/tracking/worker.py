"""The tracking process: holds a run's Tracker for a training process (scalelab/tracking/process.py),
one run at a time (in a multirun, each job's in turn).

    python -m scalelab.tracking.worker READ_FD WRITE_FD LOG_LEVEL OWNER_PID TRACKING_URI

It warms up at once (imports mlflow; opens the store when it already exists, so a run whose
inputs fail leaves no new store behind), then answers one request at a time until its pipe
closes: ``(op, args, kwargs)`` -> ``(status, value, log records)``.
"""

from __future__ import annotations

import signal

# First: a Ctrl-C or SIGTERM is the training process's to handle (it then closes the run here).
for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
    signal.signal(_sig, signal.SIG_IGN)

import contextlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from multiprocessing.connection import Connection  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

CALLS = ("log_params", "log_metrics", "set_tags", "log_artifact", "log_text",
         "start_system_metrics", "end")  # Tracker methods the training process may call


_PLAIN = (str, int, float, bool, type(None))


class _Records(logging.Handler):
    """Log records, kept to travel back with the next reply (emitted there, in the training
    process's handlers: console and train.log)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self.lock_ = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.exc_text or (logging.Formatter().formatException(record.exc_info)
                                   if record.exc_info else None)
        flat = {k: v for k, v in record.__dict__.items() if isinstance(v, _PLAIN)}
        flat.update(msg=record.getMessage(), args=None, exc_info=None, exc_text=text)
        with self.lock_:
            self.records.append(flat)

    def take(self) -> list[dict[str, Any]]:
        with self.lock_:
            out, self.records = self.records, []
        return out


class Worker:
    def __init__(self, owner_pid: int, tracking_uri: str) -> None:
        self.owner_pid = owner_pid
        self.tracking_uri = tracking_uri
        self.tracker: Any = None

    def warm(self) -> None:
        """Import mlflow and open an existing store while the training process does other work."""
        from mlflow.tracking import MlflowClient

        from scalelab.tracking.run import Tracker  # noqa: F401
        from scalelab.tracking.store import sqlite_init_lock

        uri = self.tracking_uri
        if uri.startswith("sqlite:///") and Path(uri[len("sqlite:///"):]).is_file():
            with sqlite_init_lock(uri):
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)

    def handle(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from scalelab.tracking.run import Tracker

        if op == "start":
            if self.tracker is not None and not self.tracker.ended:
                raise RuntimeError(f"tracking process: run {self.tracker.run_id} is still open")
            self.tracker = t = Tracker.start(**kwargs, owner_pid=self.owner_pid)
            return {"run_id": t.run_id, "run_name": t.run_name, "experiment_id": t.experiment_id,
                    "tracking_uri": t.tracking_uri, "resumed": t.resumed,
                    "skip_until": t.skip_until}
        if op == "multirun_parent":  # find or create a --multirun's parent run
            from scalelab.tracking.multirun import parent_run_id

            return parent_run_id(*args)
        if op == "set_multirun_parent":
            self.tracker.multirun_parent_id = args[0]
            return None
        if op in CALLS and self.tracker is not None:
            return getattr(self.tracker, op)(*args, **kwargs)
        raise ValueError(f"tracking process: unknown request {op!r}")

    def orphaned(self) -> None:
        """The training process is gone without closing the run (SIGKILL): send what was held
        back; the run stays RUNNING, as it would have (`scalelab.tracking.recover` closes it)."""
        if self.tracker is not None:
            with contextlib.suppress(Exception):
                self.tracker.spool.send_held()


def serve(conn_in: Connection, conn_out: Connection, worker: Worker, records: _Records) -> None:
    """Answer requests until the training process closes the pipe (or is gone)."""
    while True:
        try:
            op, args, kwargs = conn_in.recv()
        except (EOFError, OSError):
            break
        try:
            reply: tuple[str, Any] = ("ok", worker.handle(op, args, kwargs))
        except BaseException as e:  # every error goes back to the caller
            reply = ("err", (type(e).__module__, type(e).__qualname__, _plain_args(e), str(e)))
        try:
            conn_out.send((*reply, records.take()))
        except OSError:  # it died waiting for this answer
            break
    if worker.tracker is None or not worker.tracker.ended:
        worker.orphaned()


def _plain_args(e: BaseException) -> tuple[Any, ...]:
    """The exception's args if they pickle as plain values, else its text."""
    if all(isinstance(a, _PLAIN) for a in e.args):
        return tuple(e.args)
    return (str(e),)


def main(argv: list[str]) -> None:
    read_fd, write_fd, level, owner_pid, uri = argv
    records = _Records()
    root = logging.getLogger()
    root.setLevel(int(level))
    root.addHandler(records)
    conn_in, conn_out = Connection(int(read_fd), writable=False), Connection(int(write_fd),
                                                                             readable=False)
    worker = Worker(int(owner_pid), uri)
    try:
        worker.warm()
    except Exception as e:  # the first request reports it properly
        logging.getLogger(__name__).debug("warm-up failed: %s", e)
    try:
        serve(conn_in, conn_out, worker, records)
    finally:
        for record in records.take():  # nobody left to send them to
            sys.stderr.write(record["msg"] + "\n")
        sys.stderr.flush()
    # Everything is recorded and flushed: skip the interpreter's teardown of mlflow and
    # SQLAlchemy (~1 s that the training process would wait for).
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
