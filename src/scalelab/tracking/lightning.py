"""The Lightning logger of a tracked run: Lightning's metric calls go to the run's tracker.

It imports no mlflow itself (the tracker does). It does what Lightning's MLFlowLogger did for
us, minus what the tracker owns:

- hyperparameters: the tracker logs a curated flat set; Lightning's dump of hparams would add
  noise and, on resume, clash with values already logged;
- status: the tracker ends the run (FINISHED / FAILED / KILLED), not Lightning's finalize;
- resume: steps already in the run (logged after the checkpoint we resumed from, before the
  kill) are skipped, so a metric never has two values at one step.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Protocol

from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.utilities import rank_zero_only

log = logging.getLogger(__name__)
_NOT_IN_A_METRIC_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")  # MLflow's rule, as MLFlowLogger applies it


class RunTracker(Protocol):
    """What the logger needs of a tracker (scalelab.tracking.run.Tracker)."""

    run_id: str | None
    experiment_id: str | None
    tracking_uri: str | None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...


class RunLogger(Logger):
    """Lightning's view of one tracked run."""

    def __init__(self, tracker: RunTracker, skip_until: Mapping[str, int]) -> None:
        super().__init__()
        self._tracker = tracker
        self._skip_until = dict(skip_until)

    @property
    def name(self) -> str | None:
        return self._tracker.experiment_id

    @property
    def version(self) -> str | None:
        return self._tracker.run_id

    @property
    def run_id(self) -> str | None:
        return self._tracker.run_id

    @property
    def experiment(self) -> _ClientView:
        """An MlflowClient-like view for callbacks that write to the run through it."""
        return _ClientView(self._tracker)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        kept: dict[str, float] = {}
        for key, value in metrics.items():
            if key == "epoch":  # Lightning adds it to every dict; runs are step-based
                continue
            if isinstance(value, str):
                log.warning("Discarding metric with string value %s=%s.", key, value)
                continue
            if step is not None and step <= self._skip_until.get(key, -1):
                continue
            kept[_NOT_IN_A_METRIC_NAME.sub("", key)] = float(value)
        if kept:
            self._tracker.log_metrics(kept, step)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def finalize(self, status: str = "success") -> None:
        return None

    def log_text(self, text: str, artifact_file: str) -> None:
        """A text artifact of this run (e.g. samples/step_000100.txt), from a callback."""
        self._tracker.log_text(text, artifact_file)


class _ClientView:
    """The writes of MlflowClient a callback may make to this run; anything else (reads, other
    runs) goes to a real MlflowClient, imported only then."""

    def __init__(self, tracker: RunTracker) -> None:
        self._tracker = tracker

    def set_tag(self, run_id: str, key: str, value: Any, **_: Any) -> None:
        if run_id != self._tracker.run_id:
            return self._client().set_tag(run_id, key, value)
        self._tracker.set_tags({key: value})

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        if run_id != self._tracker.run_id:
            return self._client().log_text(run_id, text, artifact_file)
        self._tracker.log_text(text, artifact_file)

    def log_metric(self, run_id: str, key: str, value: float, timestamp: int | None = None,
                   step: int | None = None, **_: Any) -> None:
        if run_id != self._tracker.run_id:
            return self._client().log_metric(run_id, key, value, timestamp, step)
        self._tracker.log_metrics({key: value}, step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client(), name)

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self._tracker.tracking_uri)


__all__ = ["RunLogger", "RunTracker"]
