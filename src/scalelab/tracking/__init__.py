"""All MLflow code lives here (no other package imports mlflow).

    from scalelab.tracking import Tracker, NullTracker, is_global_zero

``rank`` is cheap; ``Tracker`` (which imports mlflow, ~1-2 s) loads on first use.
"""

from __future__ import annotations

from typing import Any

from scalelab.tracking.final import final_values
from scalelab.tracking.rank import global_rank, is_global_zero

__all__ = [
    "NullTracker",
    "Tracker",
    "final_values",
    "global_rank",
    "is_global_zero",
    "run_params",
]


def __getattr__(name: str) -> Any:
    if name == "NullTracker":
        from scalelab.tracking.null import NullTracker

        return NullTracker
    if name == "Tracker":
        from scalelab.tracking import run

        return getattr(run, name)
    if name == "run_params":
        from scalelab.tracking.params import run_params

        return run_params
    raise AttributeError(f"module 'scalelab.tracking' has no attribute {name!r}")
