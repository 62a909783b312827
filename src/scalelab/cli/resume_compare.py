"""Whether a command that continues a run (``resume=true``, or ``ckpt_path=`` inside its folder)
keeps it THE SAME run: its composed config is compared, key by key, with the one the run was
started with (Hydra's copy in ``<run folder>/.hydra/config.yaml``).

Refused, in one line naming each key and both values: any difference except
- a different run length (``train.max_steps``, ``train.max_tokens``, ``trainer.max_steps``), and
  then only with ``train.resume_schedule`` saying what happens to the lr curve;
- keys that cannot change the result (``FREE``: where and how the run is logged, shown and
  checkpointed).
Reads only: nothing is written before every check passed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from scalelab.config.spec import RunSpec
from scalelab.tracking.redact import redact
from scalelab.training.schedules import Segments, extended_segments, planned_end

log = logging.getLogger("scalelab.train")

STORED_CONFIG = Path(".hydra") / "config.yaml"
STORED_OVERRIDES = Path(".hydra") / "overrides.yaml"
# where and how a run is recorded, shown and checkpointed: never what it computes
FREE = (
    "paths.", "logger.", "tags.", "resume", "ckpt_path", "run_name",
    "callbacks.progress_bar.", "callbacks.throughput.", "callbacks.sample.",
    "callbacks.checkpoint.every_n_steps", "callbacks.checkpoint.save_last",
    "callbacks.checkpoint.save_best", "trainer.enable_progress_bar", "trainer.log_every_n_steps",
    "trainer.enable_model_summary", "train.num_threads", "train.save_at_steps",
    "train.resume_schedule", "optuna_trial",
)
LENGTH = ("train.max_steps", "train.max_tokens", "trainer.max_steps")
_ABSENT = "(absent)"


def differences(stored: Any, requested: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, stored value, requested value) for each difference; a section present on one
    side only is one entry (``callbacks.early_stopping: {...} -> (absent)``)."""
    if not (isinstance(stored, dict) and isinstance(requested, dict)):
        return [] if stored == requested else [(prefix.rstrip("."), stored, requested)]
    out: list[tuple[str, Any, Any]] = []
    for k in sorted(stored.keys() | requested.keys(), key=str):
        out += differences(stored.get(k, _ABSENT), requested.get(k, _ABSENT), f"{prefix}{k}.")
    return out


def _redacted(tree: Any) -> Any:
    """``tree`` with every string's URI password as ``***`` (tracking/redact.py)."""
    if isinstance(tree, dict):
        return {k: _redacted(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_redacted(v) for v in tree]
    return redact(tree) if isinstance(tree, str) else tree


def _free(key: str) -> bool:
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in FREE)


def _short(value: Any) -> str:
    text = "{...}" if isinstance(value, dict) and value else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def stored_config(out_dir: Path) -> dict[str, Any] | None:
    """The config the run in ``out_dir`` was started (or last continued) with; None if unknown."""
    path = out_dir / STORED_CONFIG
    if not path.is_file():
        return None
    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return tree if isinstance(tree, dict) else None


def _stored_overrides(out_dir: Path) -> str:
    path = out_dir / STORED_OVERRIDES
    try:
        items = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else []
    except Exception:  # an unreadable copy only shortens the hint
        items = []
    kept = [str(o) for o in items or [] if not _free(str(o).lstrip("+~").split("=", 1)[0])]
    return " ".join(kept) or "none"


def check_same_run(out_dir: Path, requested: dict[str, Any], spec: RunSpec,
                   ckpt_meta: dict[str, Any], how: str = "resume=true") -> Segments:
    """Raise (one line) unless the command continues the run unchanged; return its lr curve
    (``training.schedules`` segments) for the run's new length. ``how``: the key that named
    the checkpoint, for the message (``resume=true``, ``ckpt_path=<file>``)."""
    segments = [(int(a), int(b)) for a, b in ckpt_meta.get("lr_segments") or []]
    stored = stored_config(out_dir)
    if stored is not None:
        # Hydra's copy holds URI passwords as *** (cli/hydra_copies.py): compare both redacted
        diffs = [d for d in differences(_redacted(stored), _redacted(requested)) if not _free(d[0])]
        changed = [d for d in diffs if d[0] not in LENGTH]
        if changed:
            listed = "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, a, b in changed)
            raise ValueError(
                f"{how} would change the run in {out_dir}: {listed}. Repeat the run's "
                f"overrides ({_stored_overrides(out_dir)}) and change only its length "
                "(train.max_steps/max_tokens with train.resume_schedule) or logging keys; or "
                "start a new run (train.init_from=<checkpoint> to start from its weights)")
        if not segments:
            segments = [(0, _planned_steps(stored, spec.max_steps))]
    if not segments:
        segments = [(0, spec.max_steps)]  # a run from before the curve was stored: as planned now
    end = planned_end(segments)
    if spec.max_steps == end:
        return segments
    mode = spec.train.resume_schedule
    if mode is None:
        raise ValueError(
            f"{how}: the run's lr curve was planned for {end} steps and this command has "
            f"{spec.max_steps}; say how to go on: train.resume_schedule=continue (keep the curve, "
            f"hold its final lr), restart (a new warmup and decay over the added steps) or replan "
            f"(stretch the curve to {spec.max_steps} steps)")
    return extended_segments(segments, spec.max_steps, str(mode))


def _planned_steps(stored: dict[str, Any], fallback: int) -> int:
    """The run length the stored config planned (its lr curve was laid out over it)."""
    from scalelab.config.spec import build_spec

    try:
        return build_spec(OmegaConf.create(stored)).max_steps
    except Exception:  # a config this version no longer builds: the command's length
        return fallback


def schedule_line(spec: RunSpec, segments: Segments) -> str:
    """The banner's lr line: the schedule, its warmup, and how a resumed curve goes on."""
    optim = spec.optim
    start, length = segments[-1]
    text = (f"{optim.schedule}, peak {optim.lr:g}, warmup {optim.resolve_warmup(length)} steps, "
            f"planned over {planned_end(segments):,} steps")
    if len(segments) > 1:
        text += f" (restarted at step {start:,} by train.resume_schedule)"
    elif spec.max_steps > planned_end(segments):
        text += f", then held at its final lr to step {spec.max_steps:,} (train.resume_schedule=continue)"
    note = optim.warmup_note(length)
    return text + (f"; {note}" if note else "")
