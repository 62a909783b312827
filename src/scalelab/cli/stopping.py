"""What `scalelab-train` does when a signal stops a run: record it, say how to resume, exit 128+N.

The stopping itself (at a step boundary, with a checkpoint) is scalelab.training.signals; this
is the command-line side: the run's tags, summary.json fields, the SLURM requeue, and the one
line that tells the user the exact command that continues the run.
"""

from __future__ import annotations

import logging
import shlex
import signal
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig

from scalelab.config.names import hydra_quoted
from scalelab.config.spec import RunSpec
from scalelab.training.signals import REQUEUE_SIGNAL, STOP, RunStopped, requeue_slurm_job

log = logging.getLogger("scalelab.train")
_NOT_CARRIED = ("resume", "ckpt_path", "paths.output_dir")


def resume_command(spec: RunSpec, out_dir: Path) -> str:
    """The command that continues this run (a sweep point: rerunning the sweep does it)."""
    if spec.logger.parent_run_id:
        return "rerun the same scalelab-sweep command (it resumes this point from its checkpoint)"
    overrides: list[str] = []
    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in _NOT_CARRIED]
    # the folder holds the run name, which may hold a comma, a quote or a space
    return shlex.join(["scalelab-train", *keep, "resume=true",
                       f"paths.output_dir={hydra_quoted(str(out_dir))}"])


def on_stop(spec: RunSpec, out_dir: Path, tracker: Any, exc: BaseException,
            rank0: bool) -> tuple[dict[str, Any], RunStopped] | None:
    """None unless a signal stopped the run; else (summary fields, the exception to exit with).

    Closes the MLflow run as KILLED (idempotent: the status guard usually did) and tags it with
    the signal, so the UI says why; SIGUSR1 under SLURM also asks for a requeue.
    """
    signum = STOP.stopped_by(exc)
    if signum is None:
        return None
    name = signal.Signals(signum).name
    ckpt = out_dir / "checkpoints" / "last.ckpt"
    fields: dict[str, Any] = {"signal": name, "exit_code": 128 + signum,
                              "checkpoint": str(ckpt) if ckpt.exists() else None}
    if rank0:
        command = resume_command(spec, out_dir)
        fields["resume_command"] = command
        tags = {"scalelab.stop_signal": name}
        if signum == REQUEUE_SIGNAL:
            fields["requeue"] = requeue_slurm_job()
            tags["scalelab.requeue"] = fields["requeue"]
            log.warning("%s: %s", name, fields["requeue"])
        tracker.end("KILLED")
        tracker.set_tags(tags)
        where = f"; checkpoint {ckpt}" if fields["checkpoint"] else "; no checkpoint yet"
        print(f"stopped by {name}: run recorded as KILLED{where}\nresume with: {command}",
              flush=True)
    return fields, RunStopped(signum)


__all__ = ["on_stop", "resume_command"]
