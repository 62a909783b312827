"""Stopping a run on a signal: at a step boundary, with a resumable checkpoint, recorded truthfully.

    SIGTERM (kill, timeout, docker/k8s, SLURM preemption) -> KILLED, exit 143
    SIGINT  (Ctrl-C)                                      -> KILLED, exit 130
    SIGUSR1 (SLURM pre-timeout, sbatch --signal=USR1@90)  -> checkpoint, `scontrol requeue`, exit 138

During ``trainer.fit``/``validate`` the first signal is only recorded: ``SaveOnStop``
(``save_on_stop.py``) stops the loop at the end of the current optimizer step (on every rank at
the same step under DDP), so the checkpoint written on the way out holds a consistent step. A
second Ctrl-C stops at once. Outside the Trainer (data preparation, final sample, uploads) a
signal raises ``RunStopped`` right away.

``RunStopped`` is a ``SystemExit`` whose code is 128 + the signal number, so whatever does not
catch it still exits with the shell's conventional code.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Lightning is imported by the Trainer, not here: a bad input fails before it
    import pytorch_lightning as pl

log = logging.getLogger("scalelab.train")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
REQUEUE_SIGNAL = signal.SIGUSR1


class RunStopped(SystemExit):
    """The run was stopped by a signal; ``code`` is 128 + signum (143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


class StopRequest:
    """Process-wide record of the first stop signal, and the handlers that set it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.trainer: pl.Trainer | None = None  # set while a Trainer loop runs
        self.deferring = False  # set while the run's final status is being recorded
        self._previous: dict[int, Any] = {}

    # --- handlers ------------------------------------------------------------------------
    def install(self) -> None:
        """Take over SIGTERM, SIGUSR1 and (unless the parent ignores it) SIGINT."""
        # a --multirun runs several jobs in one process
        self.signum, self.trainer, self.deferring = None, None, False
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal only works there; Hydra/joblib workers keep the defaults
        for sig in STOP_SIGNALS:
            current = signal.getsignal(sig)
            # A shell without job control starts background jobs with SIGINT ignored on
            # purpose (so a terminal Ctrl-C does not reach them): respect that.
            if sig == signal.SIGINT and current == signal.SIG_IGN:
                continue
            self._previous[sig] = current
            signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.deferring:  # the status is being written to every store: let it finish
            if self.signum is None:
                self.signum = signum
            return
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
            # Already stopping: SLURM's requeue or cancel sends SIGTERM to every process of the
            # job (srun forwards it once more) while the first stop still saves the checkpoint
            # and sends the last metrics; raising again would cut that short.
            return
        self.signum = signum
        if self.trainer is not None:
            again = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
            log.warning("%s: stopping after the current step and saving a checkpoint%s",
                        signal.Signals(signum).name, again)
        if self.trainer is not None:
            return  # SaveOnStop stops the loop at the next batch boundary
        raise RunStopped(signum)

    # --- the run's final status ----------------------------------------------------------------
    def defer(self) -> None:
        """From here a signal is only noted: the status being recorded (FINISHED, or KILLED and
        FAILED on the way out) reaches summary.json and MLflow whole, never half of it."""
        self.deferring = True

    def deferred_signal(self) -> str | None:
        """The name of a signal that came while deferring (None: none came)."""
        return signal.Signals(self.signum).name if self.deferring and self.signum else None

    # --- after the Trainer -------------------------------------------------------------------
    def raise_if_stopped(self) -> None:
        """Call after ``fit``/``validate`` returned: a signal at the last batch is still a stop."""
        if self.signum is not None:
            raise RunStopped(self.signum)

    def stopped_by(self, exc: BaseException) -> int | None:
        """The signal behind ``exc`` (None: not a signal stop)."""
        if isinstance(exc, RunStopped):
            return exc.signum
        if isinstance(exc, (_lightning_sigterm(), KeyboardInterrupt)) or (
                isinstance(exc, SystemExit) and self.signum is not None):
            return self.signum or (signal.SIGINT if isinstance(exc, KeyboardInterrupt)
                                   else signal.SIGTERM)
        return None


def _lightning_sigterm() -> type[BaseException] | tuple[()]:
    """Lightning's SIGTERMException, once Lightning is loaded (only then can one be raised)."""
    mod = sys.modules.get("pytorch_lightning.utilities.exceptions")
    return mod.SIGTERMException if mod is not None else ()


STOP = StopRequest()
PHASE_ENV = "SCALELAB_SIGNAL_AT_PHASE"


def at_phase(name: str) -> None:
    """A named boundary of the run's end (final_validation, final_checkpoint, final_sample,
    upload, summary, mlflow_end, exit). With ``$SCALELAB_SIGNAL_AT_PHASE=<name>`` the process
    sends itself SIGTERM there: how a test reaches each boundary without depending on timing."""
    if os.environ.get(PHASE_ENV) == name:
        os.kill(os.getpid(), signal.SIGTERM)


# --- SLURM -------------------------------------------------------------------------------------
def slurm_job_id() -> str | None:
    """The job to requeue: ARRAY_JOB_ID_TASK_ID for array jobs, else SLURM_JOB_ID."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def requeue_slurm_job() -> str:
    """``scontrol requeue <job>``; returns what happened, in one line (never raises)."""
    job = slurm_job_id()
    if not job:
        return "not a SLURM job (no SLURM_JOB_ID): not requeued"
    try:
        r = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`scontrol requeue {job}` failed ({type(e).__name__}: {e}); resubmit it by hand"
    if r.returncode != 0:
        why = (r.stderr or r.stdout).strip().splitlines()
        return (f"`scontrol requeue {job}` failed (exit {r.returncode}"
                + (f": {why[-1]}" if why else "") + "); resubmit it by hand")
    return f"requeued SLURM job {job}; it resumes from the checkpoint"


def is_slurm_requeue() -> bool:
    """True in a job that SLURM started again after a requeue (or a node failure)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0").strip() not in ("", "0")


__all__ = ["PHASE_ENV", "REQUEUE_SIGNAL", "STOP", "RunStopped", "StopRequest",
           "at_phase", "is_slurm_requeue", "requeue_slurm_job", "slurm_job_id"]
