"""Scoring each finished sweep point from the sweep process, and logging the result to the
point's own MLflow run: on the study's fixed held-out set (``scaling/heldout.py``) and, when
``sweep.task_items`` is set, on the line-ending task (``scaling/task_metric.py``)."""

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
        ckpt = point_checkpoint(self.sweep_dir, p)
        if not ckpt.is_file():
            self.echo(f"  [yellow]{p.name}: no {ckpt}; its fits use final/val_loss[/yellow]")
            return
        m = evaluate_checkpoint(ckpt, self.heldout)
        _record(self.parent, child, m, HELDOUT_SET_TAG, self.fingerprint)
        self.scored += 1
        again = ""
        if had:  # scored before on another set (or before sets had fingerprints)
            again = " (scored again: the held-out set changed)"
        self.echo(f"    held-out {p.name}: {m[HELDOUT_KEYS[0]]:.4f} ± {m[HELDOUT_KEYS[1]]:.4f} "
                  f"({m[HELDOUT_KEYS[1]] / m[HELDOUT_KEYS[0]]:.2%}) on {m[HELDOUT_KEYS[2]]:,.0f} "
                  f"tokens{again}")

    def score_all(self, points: list[PlanPoint]) -> None:
        """Every finished point not scored yet (e.g. trained by an earlier invocation)."""
        _score_all([self], points)


def _score_all(scorers: list[Any], points: list[PlanPoint]) -> None:
    """Each of ``scorers`` on every finished point among ``points`` (one query for the children)."""
    from scalelab.scaling.collect import latest_finished

    if not scorers:
        return
    done = latest_finished(scorers[0].parent.children())
    for p in points:
        if p.point_id in done:
            for scorer in scorers:
                scorer(p, done[p.point_id])


def _record(parent: Any, child: Any, metrics: dict[str, float], tag: str, fingerprint: str) -> None:
    """Log ``metrics`` and the scored set's fingerprint to the child's run, and keep the
    in-memory child in step (the later fits read it)."""
    for k, v in metrics.items():
        parent.client.log_metric(child.run_id, k, v)
    parent.client.set_tag(child.run_id, tag, fingerprint)
    child.metrics.update(metrics)
    child.tags[tag] = fingerprint


def point_checkpoint(sweep_dir: Path, p: PlanPoint) -> Path:
    """The point's final checkpoint (also when it trained under an earlier plan, where its
    folder's index differed); the expected path when there is none."""
    ckpt = sweep_dir / "runs" / p.name / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        found = sorted(sweep_dir.glob(f"runs/*_{p.point_id[:8]}/checkpoints/last.ckpt"))
        ckpt = found[-1] if found else ckpt
    return ckpt


class TaskScorer:
    """Scores each finished point's final checkpoint on the line-ending task and logs
    final/task_loss, _acc, _acc_se and _items to the point's own MLflow run (the tune stage's
    runs are left out: nothing reads their task scores)."""

    def __init__(self, parent: Any, sweep_dir: Path, task: Any,
                 echo: Callable[[str], None] = print) -> None:
        self.parent, self.sweep_dir, self.task, self.echo = parent, sweep_dir, task, echo
        self.fingerprint = task.fingerprint

    def __call__(self, p: PlanPoint, child: Any) -> None:
        from scalelab.scaling.task_metric import TASK_KEYS, evaluate_task
        from scalelab.tracking.sweep import TASK_SET_TAG

        if p.stage == "tune":  # the task forecast uses the study's points and forecast runs
            return
        if TASK_KEYS[1] in child.metrics and child.tags.get(TASK_SET_TAG) == self.fingerprint:
            return
        ckpt = point_checkpoint(self.sweep_dir, p)
        if not ckpt.is_file():
            self.echo(f"  [yellow]{p.name}: no {ckpt}; no task score[/yellow]")
            return
        m = evaluate_task(ckpt, self.task)
        _record(self.parent, child, m, TASK_SET_TAG, self.fingerprint)
        self.echo(f"    task {p.name}: accuracy {m[TASK_KEYS[1]]:.3f} ± {m[TASK_KEYS[2]]:.3f}, "
                  f"task loss {m[TASK_KEYS[0]]:.4f} on {m[TASK_KEYS[3]]:,.0f} items")

    def score_all(self, points: list[PlanPoint]) -> None:
        _score_all([self], points)


class Scorers:
    """Several scorers called as one (the launcher's ``on_finished`` takes one)."""

    def __init__(self, *scorers: Any) -> None:
        self.scorers = [s for s in scorers if s is not None]

    def __call__(self, p: PlanPoint, child: Any) -> None:
        for s in self.scorers:
            s(p, child)

    def score_all(self, points: list[PlanPoint]) -> None:
        _score_all(self.scorers, points)

