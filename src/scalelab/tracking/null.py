"""The tracker of a run that records nothing (ranks > 0, ``logger=none``, fast_dev_run).

Its own module without mlflow, so a run with ``logger=none`` never imports mlflow (~2-10 s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class NullTracker:
    """Stands in on ranks > 0 and with ``logger=none``: same methods, no side effects."""

    run_id: str | None = None
    run_name: str | None = None
    experiment_id: str | None = None
    tracking_uri: str | None = None
    resumed = False

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def start_system_metrics(self, interval: float = 10.0) -> None: ...
    def lightning_logger(self) -> Any:
        return False  # Trainer(logger=False)

    def end(self, status: str = "FINISHED") -> None: ...

    @contextlib.contextmanager
    def status_guard(self) -> Iterator[None]:
        yield
