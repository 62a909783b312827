"""scalelab.model: one configurable transformer in pure PyTorch (no Lightning, Hydra or MLflow).

    from scalelab.model import ModelConfig, Transformer
    cfg = ModelConfig(vocab_size=65, max_seq_len=64, d_model=128, n_layers=4, n_heads=4)
    model = Transformer(cfg)            # logits = model(input_ids)  -> [B, T, V]
    cfg.n_params(), cfg.flops_per_token()
"""

from .config import ARCHS, MLPS, NORM_POSITIONS, NORMS, POSITIONS, Component, ModelConfig
from .presets import PRESETS, preset
from .transformer import DecodeCache, Transformer

__all__ = [
    "ARCHS",
    "MLPS",
    "NORMS",
    "NORM_POSITIONS",
    "POSITIONS",
    "PRESETS",
    "Component",
    "DecodeCache",
    "ModelConfig",
    "Transformer",
    "preset",
]
