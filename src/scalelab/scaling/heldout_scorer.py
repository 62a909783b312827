"""Scoring each finished sweep point on the study's fixed held-out set (``scaling/heldout.py``)
from the sweep process, and logging the result to the point's own MLflow run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .plan import PlanPoint


class HeldoutScorer:
    """Scores each finished point's final checkpoint on the sweep's fixed held-out set and
    logs final/heldout_loss, _se and _tokens to the point's own MLflow run."""

    def __init__(self, parent: Any, sweep_dir: Path, heldout: Any,
                 echo: Callable[[str], None] = print) -> None:
        self.parent, self.sweep_dir, self.heldout, self.echo = parent, sweep_dir, heldout, echo
        self.fingerprint = heldout.fingerprint
        self.scored = 0

    def __call__(self, p: PlanPoint, child: Any) -> None:
        from scalelab.scaling.heldout import HELDOUT_KEYS, evaluate_checkpoint
        from scalelab.tracking.sweep import HELDOUT_SET_TAG

        was, had = child.tags.get(HELDOUT_SET_TAG), HELDOUT_KEYS[0] in child.metrics
        if had and was == self.fingerprint:
            return
        ckpt = self.sweep_dir / "runs" / p.name / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():  # trained under an earlier plan, where its index differed
            found = sorted(self.sweep_dir.glob(f"runs/*_{p.point_id[:8]}/checkpoints/last.ckpt"))
            ckpt = found[-1] if found else ckpt
        if not ckpt.is_file():
            self.echo(f"  [yellow]{p.name}: no {ckpt}; its fits use final/val_loss[/yellow]")
            return
        m = evaluate_checkpoint(ckpt, self.heldout)
        for k, v in m.items():
            self.parent.client.log_metric(child.run_id, k, v)
        self.parent.client.set_tag(child.run_id, HELDOUT_SET_TAG, self.fingerprint)
        child.metrics.update(m)
        child.tags[HELDOUT_SET_TAG] = self.fingerprint
        self.scored += 1
        again = ""
        if had:  # scored before on another set (or before sets had fingerprints)
            again = " (scored again: the held-out set changed)"
        self.echo(f"    held-out {p.name}: {m[HELDOUT_KEYS[0]]:.4f} ± {m[HELDOUT_KEYS[1]]:.4f} "
                  f"({m[HELDOUT_KEYS[1]] / m[HELDOUT_KEYS[0]]:.2%}) on {m[HELDOUT_KEYS[2]]:,.0f} "
                  f"tokens{again}")

    def score_all(self, points: list[PlanPoint]) -> None:
        """Every finished point not scored yet (e.g. trained by an earlier invocation)."""
        from scalelab.scaling.collect import latest_finished

        done = latest_finished(self.parent.children())
        for p in points:
            if p.point_id in done:
                self(p, done[p.point_id])

