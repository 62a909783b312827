"""Hydra's own copies of the config (``<run folder>/.hydra/{config,hydra,overrides}.yaml`` and a
multirun's ``multirun.yaml``) hold every override as typed, a password in a URI included
(``logger.tracking_uri=http://u:pw@host``). This Hydra callback rewrites them redacted
(tracking/redact.py) as each job starts, before the task runs; the job's overrides that Hydra
prints when a job failed are redacted as it ends.

Nothing reads a secret back from these copies: a ``resume=true`` takes its tracking URI from
the command (or ``$MLFLOW_TRACKING_URI``), and its comparison with the stored config
(cli/resume_compare.py) redacts the command's values the same way.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from scalelab.data.files import atomic_write_text
from scalelab.tracking.redact import redact

JOB_COPIES = ("config.yaml", "hydra.yaml", "overrides.yaml")
MULTIRUN_COPY = "multirun.yaml"


def redact_file(path: Path) -> None:
    """Rewrite ``path`` (atomically) with every URI password as ``***``; untouched if none."""
    with contextlib.suppress(FileNotFoundError):
        text = path.read_text(encoding="utf-8")
        clean = redact(text)
        if clean != text:
            atomic_write_text(path, clean)


class RedactedConfigCopies(Callback):
    """Registered in conf/hydra/default.yaml (``hydra.callbacks.redacted_config_copies``)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = config.hydra
        if hydra.output_subdir is not None:
            folder = Path(str(hydra.runtime.output_dir)) / str(hydra.output_subdir)
            for name in JOB_COPIES:
                redact_file(folder / name)
        if hydra.mode is not None and str(hydra.mode).endswith("MULTIRUN"):
            redact_file(Path(str(hydra.sweep.dir)) / MULTIRUN_COPY)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        # Hydra's report of a failed job prints these ("Error executing job with overrides")
        job_return.overrides = [redact(o) for o in job_return.overrides or []]

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        redact_file(Path(str(config.hydra.sweep.dir)) / MULTIRUN_COPY)  # a sweeper's late rewrite
