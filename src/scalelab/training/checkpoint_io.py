"""``VerifiedCheckpointIO``: Lightning's checkpoint IO plugin writing and reading through
``checkpoint.py`` (temp file, fsync, rename, size/hash sidecar). Apart from ``checkpoint.py`` so
that reading a checkpoint, as the input checks do, does not import Lightning."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from lightning_fabric.plugins import TorchCheckpointIO

from scalelab.training.checkpoint import read_checkpoint, sidecar_path, write_checkpoint


class VerifiedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with ``write_checkpoint``/``read_checkpoint`` semantics."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("VerifiedCheckpointIO takes no storage_options")
        write_checkpoint(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        # weights_only is ignored on purpose: scalelab checkpoints hold plain data only
        return read_checkpoint(path, map_location=map_location or "cpu")

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        with contextlib.suppress(FileNotFoundError):
            sidecar_path(Path(path)).unlink()
