"""scalelab.model: one configurable transformer in pure PyTorch (no Lightning, Hydra or MLflow).

    from scalelab.model import ModelConfig, Transformer
    cfg = ModelConfig(vocab_size=65, max_seq_len=64, d_model=128, n_layers=4, n_heads=4)
    model = Transformer(cfg)            # logits = model(input_ids)  -> [B, T, V]
    cfg.n_params(), cfg.flops_per_token()

The names below are imported on first use, so ``scalelab.model.config`` and its accounting
(what the sweep planner and the scaling fits read) load without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .accounting import N_CONVENTIONS, Component, n_counts
    from .config import ModelConfig
    from .presets import PRESETS, preset
    from .transformer import DecodeCache, Transformer
    from .variants import ARCHS, MLPS, NORM_POSITIONS, NORMS, POSITIONS

_WHERE = {
    "ARCHS": "variants", "MLPS": "variants", "NORMS": "variants", "NORM_POSITIONS": "variants",
    "POSITIONS": "variants", "Component": "accounting", "N_CONVENTIONS": "accounting",
    "n_counts": "accounting", "ModelConfig": "config", "PRESETS": "presets", "preset": "presets",
    "DecodeCache": "transformer", "Transformer": "transformer",
}
__all__ = [  # the keys of _WHERE, spelled out for linters and IDEs
    "ARCHS", "MLPS", "NORMS", "NORM_POSITIONS", "N_CONVENTIONS", "POSITIONS", "PRESETS",
    "Component", "DecodeCache", "ModelConfig", "Transformer", "n_counts", "preset",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
