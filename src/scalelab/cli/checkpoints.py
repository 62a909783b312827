"""Finding and loading a checkpoint for sample/export/eval; the format is ``training.checkpoint``'s."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from scalelab.data.tokenizers import tokenizer_from_spec
from scalelab.training.checkpoint import (
    consolidated_if_sharded,
    model_config,
    model_of,
    model_state_dict,
    newest_verified,
    read_checkpoint,
    run_meta,
)

# sample/export/eval/viz/interop import these from here; the checkpoint module owns them
__all__ = ["find_checkpoint", "load", "model_config_dict", "model_state_dict", "run_meta",
           "tokenizer_from_spec", "verified_model"]


def find_checkpoint(path: str | Path) -> Path:
    """A .ckpt file, or a run folder (-> checkpoints/last.ckpt)."""
    p = Path(path).expanduser().resolve()
    p = consolidated_if_sharded(p)
    if p.is_dir():
        # a run folder: the newest checkpoint that verifies (a truncated last.ckpt is skipped)
        chosen, skipped = newest_verified(p / "checkpoints" if (p / "checkpoints").is_dir() else p)
        for path, why in skipped:
            print(f"warning: skipped {path} ({why})", file=sys.stderr)
        if chosen is not None:
            return consolidated_if_sharded(chosen)
        raise FileNotFoundError(f"{p}: no usable checkpoint in this folder (checkpoints/last.ckpt "
                                "or best.ckpt); pass a .ckpt file")
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such checkpoint file or run folder")
    return p


def load(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict, loaded with weights_only=True (no pickled code runs)."""
    ckpt_path = find_checkpoint(path)
    ckpt = read_checkpoint(ckpt_path)  # one clear line for a truncated/garbage file
    ckpt["_path"] = str(ckpt_path)
    return ckpt


def model_config_dict(ckpt: dict[str, Any]) -> dict[str, Any]:
    cfg = model_config(ckpt)
    if not cfg:
        raise ValueError(f"{ckpt.get('_path')}: no model config in the checkpoint (not from scalelab-train?)")
    return cfg


def verified_model(ckpt: dict[str, Any]) -> Any:
    """The checkpoint's Transformer; refused in one line if its tensors do not fit its config."""
    return model_of(model_config_dict(ckpt), model_state_dict(ckpt), ckpt.get("_path", "?"))
