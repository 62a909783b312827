"""MLflow in a process of its own, so the training process never imports it.

Why: importing mlflow and opening its SQLAlchemy store cost ~4 s of CPU before the first step
(docs/performance.md). The tracking process (scalelab/tracking/worker.py) is started as soon as
the tracking URI is known and does that work on another core while the training process imports
torch and Lightning and prepares the data. It then holds the run's Tracker (scalelab/tracking/
run.py, unchanged): RemoteTracker here forwards each call and waits for its answer, so an error
is raised where the call was made, and the tracker's log lines are emitted in this process (they
reach the console and train.log as before).

The tracking process ignores SIGINT/SIGTERM/SIGUSR1/SIGHUP: a stop is the training process's to
handle, and it records the status through it. When the training process dies without closing
it (SIGKILL), it sees its pipe close, sends the metric values it held back, and exits.

In a Hydra ``--multirun`` (a sweep's points), a job's tracking process outlives its run: once
the run is ended it is kept for the next job of the same process and store, which would
otherwise wait ~2 s for a new one to import mlflow (docs/performance.md, twenty-third session).
It serves one run at a time; the process exits when this one does.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from scalelab.tracking import store
from scalelab.tracking.guard import StatusGuarded

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 30.0  # for the tracking process to exit once its pipe is closed
# A finished multirun job's tracking process, kept for the next job (at most one).
_KEPT: list[TrackingProcess] = []


class TrackingError(RuntimeError):
    """An error of the tracking process that has no equivalent here (e.g. MlflowException)."""


class TrackingProcessGone(OSError):
    """The tracking process exited before the run was closed (an OSError: the CLI reports it
    in one line)."""


class TrackingProcess:
    """The tracking process of a run (in a multirun, of each job's run in turn): started early,
    closed when the run is, or kept for the next job."""

    def __init__(self, tracking_uri: str, keep_for_next: bool = False) -> None:
        self.tracking_uri = tracking_uri
        self.keep_for_next = keep_for_next  # leaving the context keeps it for the next run
        parent_read, child_write = os.pipe()
        child_read, parent_write = os.pipe()
        level = logging.getLogger().getEffectiveLevel()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scalelab.tracking.worker", str(child_read), str(child_write),
             str(level), str(os.getpid()), tracking_uri],
            pass_fds=(child_read, child_write), stdin=subprocess.DEVNULL, start_new_session=True)
        os.close(child_read)
        os.close(child_write)
        self._send = Connection(parent_write, readable=False)
        self._recv = Connection(parent_read, writable=False)
        self._owed = 0  # replies not read yet (a call interrupted by an exception)
        self._run_started = False
        self._run_open = False  # a run started here and not ended yet
        atexit.register(self.close)

    @classmethod
    def for_run(cls, tracking_uri: str, keep_for_next: bool = False) -> TrackingProcess:
        """The process a previous run of this process kept (alive, same store), else a new one."""
        while _KEPT:
            kept = _KEPT.pop()
            if kept.tracking_uri == tracking_uri and kept.proc.poll() is None:
                kept.keep_for_next = keep_for_next
                return kept
            kept.close()
        return cls(tracking_uri, keep_for_next)

    def __enter__(self) -> TrackingProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        """Keep it for the next run when asked to and it holds no open run; else close it."""
        if self.keep_for_next and self.reusable:
            while _KEPT:
                _KEPT.pop().close()
            _KEPT.append(self)
        else:
            self.close()

    @property
    def reusable(self) -> bool:
        """Alive, every reply read, and no run open in it (a run left open must see the pipe
        close: the process then sends what it held back, and the run stays RUNNING)."""
        return (not self._run_open and not self._owed and not self._send.closed
                and self.proc.poll() is None)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``op`` in the tracking process and return its result (or raise its error)."""
        try:
            while self._owed:
                self._recv.recv()
                self._owed -= 1
            self._send.send((op, args, kwargs))
            self._owed += 1
            self._run_started = self._run_started or op == "start"
            status, value, records = self._recv.recv()
            self._owed -= 1
            if status == "ok" and op in ("start", "end"):
                self._run_open = op == "start"
        except (OSError, EOFError):
            raise TrackingProcessGone(f"the MLflow tracking process (pid {self.proc.pid}) "
                                      f"{self._how_it_ended()}") from None
        for record in records:
            logging.getLogger(record["name"]).handle(logging.makeLogRecord(record))
        if status == "err":
            raise _rebuilt(*value)
        return value

    def _how_it_ended(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1.0)
        code = self.proc.returncode
        if code is None:
            return "stopped answering"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:  # a real-time signal has no name
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def close(self) -> None:
        """Close the pipe and wait for the process to exit (idempotent). Before a run was
        started it holds nothing: it is killed at once (a config error exits without waiting
        for its warm-up)."""
        atexit.unregister(self.close)
        if not self._run_started and self.proc.poll() is None:
            self.proc.kill()
        for conn in (self._send, self._recv):
            with contextlib.suppress(OSError):
                conn.close()
        try:
            self.proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _rebuilt(module: str, name: str, args: tuple[Any, ...], text: str) -> BaseException:
    """The tracking process's exception as one of ours: builtins and scalelab.tracking.store's
    keep their class (callers catch ValueError, OSError, TrackingServerUnreachable)."""
    cls = getattr(builtins if module == "builtins" else store if module == store.__name__ else None,
                  name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        with contextlib.suppress(Exception):
            return cls(*args)
    return TrackingError(f"{name}: {text}")


class RemoteTracker(StatusGuarded):
    """The Tracker of a run that lives in its TrackingProcess (same methods, same errors)."""

    def __init__(self, process: TrackingProcess, info: Mapping[str, Any]) -> None:
        self.process = process
        self.run_id: str = info["run_id"]
        self.run_name: str | None = info["run_name"]
        self.experiment_id: str = info["experiment_id"]
        self.tracking_uri: str = info["tracking_uri"]
        self.resumed: bool = info["resumed"]
        self.skip_until: dict[str, int] = dict(info["skip_until"])
        self._multirun_parent_id: str | None = None
        self._ended = False

    @classmethod
    def start(cls, process: TrackingProcess, **kwargs: Any) -> RemoteTracker:
        """Tracker.start's arguments, run in ``process`` (which must be this run's alone)."""
        try:
            return cls(process, process.call("start", **kwargs))
        except BaseException:
            process.close()  # no run to track: nothing may be left running
            raise

    @property
    def multirun_parent_id(self) -> str | None:
        return self._multirun_parent_id

    @multirun_parent_id.setter
    def multirun_parent_id(self, run_id: str | None) -> None:
        self._multirun_parent_id = run_id
        self.process.call("set_multirun_parent", run_id)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.process.call("log_params", dict(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.process.call("log_metrics", dict(metrics), step)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.process.call("set_tags", {str(k): str(v) for k, v in tags.items()})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.process.call("log_artifact", Path(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.process.call("log_text", text, artifact_file)

    def start_system_metrics(self, interval: float = 10.0) -> None:
        self.process.call("start_system_metrics", interval)

    def lightning_logger(self) -> Any:
        from scalelab.tracking.lightning import RunLogger

        return RunLogger(self, self.skip_until)

    def end(self, status: str = "FINISHED") -> bool:
        """Tracker.end in the tracking process. Never raises. Tags may still follow (why the
        run stopped); ``close`` ends the process."""
        if self._ended:
            return True
        self._ended = True
        try:
            return bool(self.process.call("end", status))
        except TrackingProcessGone as e:
            return self._end_here(status, e)
        except Exception as e:
            log.warning("could not record status %s of MLflow run %s: %s", status, self.run_id, e)
            return False

    def _end_here(self, status: str, why: TrackingProcessGone) -> bool:
        """The tracking process is gone (killed): record the status from this process, which
        imports mlflow only now. Values it was holding back are lost (at most one interval)."""
        log.warning("%s: recording status %s of MLflow run %s from the training process",
                    why, status, self.run_id)
        try:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=self.tracking_uri)
            for run_id in filter(None, (self.run_id, self._multirun_parent_id)):
                client.set_terminated(run_id, status)
            return True
        except Exception as e:
            log.warning("could not record status %s of MLflow run %s: %s", status, self.run_id, e)
            return False

    def close(self) -> None:
        """Let the tracking process exit (after ``end``; idempotent)."""
        self.process.close()


__all__ = ["RemoteTracker", "TrackingError", "TrackingProcess", "TrackingProcessGone"]
