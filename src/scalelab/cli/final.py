"""A run's final values in MLflow: tags ``final.<name>`` and a ``final_metrics.json`` table.

Not metrics: a one-point metric becomes a one-point chart that pushes the loss curves down the
run page, and resuming a finished run would log it a second time. Tags are mutable, so a
resumed run that trains further simply updates them. Read them back with
``scalelab.tracking.final_values(run)`` (which also understands older runs' ``final/*`` metrics).
"""

from __future__ import annotations

import json
from typing import Any


def record_final(tracker: Any, final: dict[str, Any]) -> None:
    values = {k.removeprefix("final/"): v for k, v in final.items() if v is not None}
    tracker.set_tags({f"final.{k}": v for k, v in values.items()})
    table = {"columns": ["name", "value"], "data": [[k, v] for k, v in values.items()]}
    tracker.log_text(json.dumps(table, indent=1) + "\n", "final_metrics.json")
