"""A ``--multirun`` job that fails on a bad input is reported in one line, not Hydra's traceback.

Hydra's sweeper re-raises a failed job's exception and prints its traceback, unless it is a
``hydra.errors.CompactHydraException``: that one is printed as its message alone (after Hydra's
own "Error executing job with overrides: [...]" line), and the multirun still exits non-zero.
The line says what was recorded: the job's summary.json status, and the multirun's parent run.
"""

from __future__ import annotations

import json
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from omegaconf import DictConfig

from scalelab.cli.run_folder import SUMMARY_FILE


class MultirunJobFailed(CompactHydraException):
    """A multirun job's bad input, as one line (Hydra prints only the message)."""


def _recorded(cfg: DictConfig) -> str:
    """What the job left on record: its summary.json status, or that it had no run."""
    out = cfg.paths.output_dir or HydraConfig.get().runtime.output_dir
    summary = Path(str(out)) / SUMMARY_FILE
    try:
        status = json.loads(summary.read_text()).get("status")
    except (OSError, ValueError):
        status = None
    job = f"job {HydraConfig.get().job.num}"
    if status:
        return f"{job} is recorded {status} in {summary}"
    return f"{job} was refused before its run started (no run folder, no MLflow run)"


def job_failed(cfg: DictConfig, error: BaseException, parent_failed: bool) -> MultirunJobFailed:
    """The one line for a multirun job that ``error`` stopped (``parent_failed``: its MLflow
    parent run was marked FAILED)."""
    parent = f"; the multirun's parent run '{cfg.run_name} (multirun)' is FAILED" if parent_failed else ""
    return MultirunJobFailed(f"error: {error}. {_recorded(cfg)}{parent}")
