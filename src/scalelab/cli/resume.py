"""Which checkpoint a `scalelab-train` command continues from, and whether it may.

Everything here only READS: the command's checkpoint (``ckpt_path=``, ``resume=true``,
``train.init_from=``) is chosen and verified, then matched against the model, objective and
tokenizer the command builds, and a FINISHED run is only reopened by ``resume=true`` with more
steps. Only then does train.py create the MLflow run, write into the folder or reopen anything.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.cli.run_folder import RUN_ID_FILE, SUMMARY_FILE
from scalelab.config.spec import RunSpec

log = logging.getLogger("scalelab.train")


@dataclass
class ResumePoint:
    ckpt: Path | None = None  # None: a fresh run
    run_id: str | None = None  # the MLflow run to reopen (None: a new MLflow run)
    key: str = ""  # the config key that named the checkpoint, for messages
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    # the lr curve (training.schedules segments); None: one schedule over the run's steps
    lr_segments: list[tuple[int, int]] | None = None

    def continues_run(self, out_dir: Path) -> bool:
        """Whether this reopens the run in ``out_dir`` (not a new run from a checkpoint)."""
        return self.ckpt is not None and self.key != "train.init_from" \
            and self.ckpt.parent.parent == out_dir


def _is_checkpoint(p: Path) -> bool:
    return p.is_file() or (p.is_dir() and (p / ".metadata").is_file())


def resume_point(spec: RunSpec, out_dir: Path) -> ResumePoint:
    """The checkpoint to continue from and the MLflow run to reopen; raises on a bad choice."""
    point = _chosen_checkpoint(spec, out_dir)
    rid = out_dir / RUN_ID_FILE
    if point.key != "train.init_from" and point.ckpt is not None \
            and point.ckpt.parent.parent == out_dir and rid.is_file():
        point.run_id = rid.read_text().strip() or None
    return point


def _chosen_checkpoint(spec: RunSpec, out_dir: Path) -> ResumePoint:
    # training.checkpoint imports torch and Lightning: only once a run is being built
    from scalelab.training.checkpoint import CheckpointError, newest_verified, verify

    if spec.ckpt_path:
        ckpt = Path(str(spec.ckpt_path)).expanduser().resolve()
        if not _is_checkpoint(ckpt):
            raise FileNotFoundError(f"ckpt_path={spec.ckpt_path}: no such checkpoint file")
        why = verify(ckpt)
        if why:
            raise CheckpointError(f"ckpt_path={ckpt}: {why}; pass another checkpoint "
                                  "(e.g. checkpoints/best.ckpt or a step_<N>.ckpt)")
        return ResumePoint(ckpt, key="ckpt_path")
    if spec.resume:
        ckpt_dir = out_dir / "checkpoints"
        ckpt, skipped = newest_verified(ckpt_dir)
        if ckpt is None and not skipped:
            raise FileNotFoundError(
                f"resume=true: {ckpt_dir / 'last.ckpt'} does not exist; the run in {out_dir} never "
                "reached its first checkpoint (train.val_every steps). Start it again without "
                "resume=true.")
        if ckpt is None:
            listed = "; ".join(f"{p.name}: {why}" for p, why in skipped)
            raise CheckpointError(f"resume=true: no usable checkpoint in {ckpt_dir} ({listed}); "
                                  "start the run again without resume=true")
        return ResumePoint(ckpt, key="resume", skipped=skipped)  # logged once it passed the checks
    if spec.train.init_from:
        # a NEW run from another run's checkpoint (WSD branch): step, optimizer and data
        # position carry over, but never the source run's MLflow run or folder
        ckpt = Path(str(spec.train.init_from)).expanduser().resolve()
        if not _is_checkpoint(ckpt):
            raise FileNotFoundError(f"train.init_from={spec.train.init_from}: no such checkpoint "
                                    "file (e.g. <run folder>/checkpoints/step_<N>.ckpt)")
        why = verify(ckpt)
        if why:
            raise CheckpointError(f"train.init_from={ckpt}: {why}; pass another checkpoint")
        return ResumePoint(ckpt, key="train.init_from")
    return ResumePoint()


def _summary(out_dir: Path) -> dict[str, Any]:
    try:
        s = json.loads((out_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return s if isinstance(s, dict) else {}


def check_same_config(point: ResumePoint, spec: RunSpec, out_dir: Path,
                      requested: dict[str, Any]) -> None:
    """When ``point`` reopens the run in ``out_dir``: raise unless ``requested`` (the command's
    unresolved config) continues it unchanged; set the run's lr curve (cli/resume_compare.py)."""
    if not point.continues_run(out_dir):
        return
    from scalelab.cli.resume_compare import check_same_run
    from scalelab.training.checkpoint import read_meta

    assert point.ckpt is not None
    meta = read_meta(point.ckpt)
    how = "resume=true" if point.key == "resume" else f"{point.key}={point.ckpt}"
    point.lr_segments = check_same_run(out_dir, requested, spec, meta, how)
    spec.run_name = str(meta.get("run_name") or spec.run_name)  # a run keeps its name


def check_resume_point(point: ResumePoint, spec: RunSpec, *, model_config: dict[str, Any],
                       tokenizer: dict[str, Any]) -> None:
    """Raise (one line) unless ``point``'s checkpoint fits this model, objective and tokenizer."""
    if point.ckpt is None:
        return
    from scalelab.training.checkpoint import check_compatible, read_meta

    check_compatible(point.key, point.ckpt, read_meta(point.ckpt), model_config=model_config,
                     objective=spec.objective, tokenizer=tokenizer)
    # only now, so a refused command writes nothing, not even to the run's train.log
    for p, why in point.skipped:
        log.warning("resume: skipped %s (%s)", p, why)
    if point.skipped:
        log.warning("resume: continuing from %s", point.ckpt)


def check_not_finished(point: ResumePoint, spec: RunSpec, out_dir: Path) -> None:
    """Raise (one line) if ``point`` reopens the FINISHED run in ``out_dir`` without adding steps.

    It needs only the run's summary and the checkpoint's step, so train.py asks it before the
    data, MLflow or Lightning: a refused resume answers in the time torch takes to import."""
    if point.ckpt is None or point.key == "train.init_from":
        return  # a fresh run, or a new run in a new folder: nothing is reopened
    summary = _summary(out_dir)
    if summary.get("status") != "FINISHED":
        return  # killed or failed: continuing it is what resume is for
    from scalelab.training.checkpoint import read_meta

    # a finished run is reopened only to ADD steps beyond the ones it finished with
    done = int((summary.get("metrics") or {}).get("final/steps")
               or read_meta(point.ckpt).get("global_step", 0))
    if not spec.resume:
        raise ValueError(
            f"{point.key}={point.ckpt} continues the FINISHED run in {out_dir}; to add steps to it "
            f"pass resume=true with train.max_steps above {done}, or start a new run from it with "
            f"train.init_from={point.ckpt}")
    if spec.max_steps <= done:
        raise ValueError(
            f"resume=true: the run in {out_dir} FINISHED at step {done} and this command has "
            f"train.max_steps={spec.max_steps}: nothing to add; raise train.max_steps above {done}")


def check_branch_keys(spec: RunSpec) -> None:
    """train.save_at_steps / train.init_from: bad values fail before any IO."""
    bad = [int(s) for s in spec.train.save_at_steps or [] if not 1 <= int(s) <= spec.max_steps]
    if bad:
        raise ValueError(f"train.save_at_steps={list(spec.train.save_at_steps)}: steps {bad} are "
                         f"outside 1..{spec.max_steps} (the run's optimizer steps)")
    if spec.train.init_from and not (spec.resume or spec.ckpt_path):
        step = module_start_step(Path(str(spec.train.init_from)).expanduser())
        if step >= spec.max_steps:
            raise ValueError(f"train.init_from={spec.train.init_from} is at step {step}, but the "
                             f"run has only {spec.max_steps} steps; raise train.max_steps")


def module_start_step(ckpt: Path | None) -> int:
    """Global step stored in a checkpoint (0 for a fresh run)."""
    if ckpt is None:
        return 0
    from scalelab.training.checkpoint import read_meta

    try:
        return int(read_meta(ckpt)["global_step"])
    except Exception:  # unreadable: throughput just covers the whole run
        return 0
