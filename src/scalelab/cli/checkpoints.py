"""Reading scalelab checkpoints safely (``torch.load(weights_only=True)``) for sample/export."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from scalelab.data.tokenizers import tokenizer_from_spec  # noqa: F401  (sample/export/viz import it from here)


def find_checkpoint(path: str | Path) -> Path:
    """A .ckpt file, or a run folder (-> checkpoints/last.ckpt)."""
    p = Path(path).expanduser().resolve()
    p = _consolidated_if_sharded(p)
    if p.is_dir():
        from scalelab.training.checkpoint import newest_verified

        # a run folder: the newest checkpoint that verifies (a truncated last.ckpt is skipped)
        chosen, skipped = newest_verified(p / "checkpoints" if (p / "checkpoints").is_dir() else p)
        for path, why in skipped:
            print(f"warning: skipped {path} ({why})", file=sys.stderr)
        if chosen is not None:
            return _consolidated_if_sharded(chosen)
        raise FileNotFoundError(f"{p}: no usable checkpoint in this folder (checkpoints/last.ckpt "
                                "or best.ckpt); pass a .ckpt file")
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such checkpoint file or run folder")
    return p


def _consolidated_if_sharded(p: Path) -> Path:
    """An FSDP sharded checkpoint folder -> its plain ``<folder>.consolidated.ckpt`` (made once)."""
    from scalelab.training.distributed import consolidate_checkpoint, is_sharded_checkpoint

    if not is_sharded_checkpoint(p):
        return p
    out = p.with_name(p.name + ".consolidated.ckpt")
    if not out.is_file() or out.stat().st_mtime < (p / ".metadata").stat().st_mtime:
        consolidate_checkpoint(p, out)
    return out


def load(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict, loaded with weights_only=True (no pickled code runs)."""
    from scalelab.training.checkpoint import read_checkpoint

    ckpt_path = find_checkpoint(path)
    ckpt = read_checkpoint(ckpt_path)  # one clear line for a truncated/garbage file
    ckpt["_path"] = str(ckpt_path)
    return ckpt


def run_meta(ckpt: dict[str, Any]) -> dict[str, Any]:
    """What `scalelab-train` stored: model config, tokenizer spec, objective, MLflow run id."""
    return dict(ckpt.get("scalelab_run") or {})


def model_config_dict(ckpt: dict[str, Any]) -> dict[str, Any]:
    meta = run_meta(ckpt)
    cfg = meta.get("model_config") or ckpt.get("hyper_parameters", {}).get("model_cfg")
    if not cfg:
        raise ValueError(f"{ckpt.get('_path')}: no model config in the checkpoint (not from scalelab-train?)")
    return dict(cfg)


def model_state_dict(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The Transformer's own weights (the LightningModule's ``model.`` prefix removed)."""
    sd = ckpt["state_dict"]
    out = {k[len("model."):]: v for k, v in sd.items() if k.startswith("model.")}
    return out or dict(sd)
