from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from scalelab.training import OptimConfig


def test_defaults_and_structured_config() -> None:
    cfg = OptimConfig()
    assert (cfg.lr, cfg.weight_decay, cfg.beta1, cfg.beta2) == (6e-4, 0.1, 0.9, 0.95)
    assert cfg.schedule == "cosine" and cfg.fused is None and cfg.decay_embeddings is False
    # It must work as an OmegaConf structured config (Optional, plain str).
    oc = OmegaConf.structured(OptimConfig)
    oc.schedule = "wsd"
    assert OmegaConf.to_object(oc) == OptimConfig(schedule="wsd")
    assert OptimConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"lr": 0.0}, "optim.lr"),
        ({"lr": -1e-3}, "optim.lr"),
        ({"weight_decay": -0.1}, "optim.weight_decay"),
        ({"beta2": 1.0}, "optim.beta2"),
        ({"schedule": "linear"}, "optim.schedule"),
        ({"warmup_steps": -1}, "optim.warmup_steps"),
        ({"warmup_fraction": 1.0}, "optim.warmup_fraction"),
        ({"min_lr_ratio": 1.5}, "optim.min_lr_ratio"),
        ({"decay_fraction": 0.0}, "optim.decay_fraction"),
        ({"grad_clip": -1.0}, "optim.grad_clip"),
        ({"decay_shape": "step"}, "optim.decay_shape"),
    ],
)
def test_bad_values_name_the_key(kw: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        OptimConfig(**kw)


def test_unknown_key() -> None:
    with pytest.raises(ValueError, match=r"unknown key.*'lrr'"):
        OptimConfig.from_dict({"lrr": 1e-3})


def test_warmup_resolution() -> None:
    assert OptimConfig(warmup_fraction=0.1).resolve_warmup(200) == 20
    assert OptimConfig(warmup_steps=7, warmup_fraction=0.5).resolve_warmup(200) == 7
    # a warmup as long as the run (a short smoke test of a preset) is capped, with a note
    assert OptimConfig(warmup_steps=300).resolve_warmup(200) == 20
    assert "capped at 20" in (OptimConfig(warmup_steps=300).warmup_note(200) or "")
    assert OptimConfig(warmup_steps=7).warmup_note(200) is None
