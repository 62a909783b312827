"""Reading a run's final values back: tags ``final.<name>`` (current), metrics ``final/<name>``
(runs recorded before the values moved to tags)."""

from __future__ import annotations

from collections.abc import Mapping


def final_values(tags: Mapping[str, str], metrics: Mapping[str, float]) -> dict[str, float]:
    """``{"val_loss": ..., "tokens_seen": ..., ...}`` from a run's tags and metrics."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key.startswith("final/"):
            out[key[6:]] = float(value)
    for key, value in tags.items():
        if key.startswith("final."):
            try:
                out[key[6:]] = float(value)
            except ValueError:
                continue
    return out
