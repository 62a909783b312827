"""Optimizer and schedule settings: one dataclass, mirrored by conf/optim/*.yaml.

Choices are plain ``str`` fields checked here (not ``Literal``, which OmegaConf structured
configs do not support), so a bad value fails naming the key and the options.
"""

import math
from dataclasses import asdict, dataclass
from typing import Any

from scalelab.data.config import from_dict_checked

SCHEDULES = ("cosine", "wsd", "constant")
DECAY_SHAPES = ("linear", "cosine", "sqrt")
# a warmup that would fill the whole run is cut to this fraction of it (short smoke runs)
WARMUP_CAP = 0.1


@dataclass
class OptimConfig:
    # AdamW
    lr: float = 6e-4  # peak learning rate (after warmup)
    weight_decay: float = 0.1  # applied to matrices only (dim >= 2)
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    decay_embeddings: bool = False  # also decay token/position embedding tables
    grad_clip: float = 1.0  # max total grad 2-norm; 0 disables clipping
    fused: bool | None = None  # None = fused kernel when torch supports the device, else foreach

    # Schedule: a multiplier on lr per optimizer step (LambdaLR, interval "step")
    schedule: str = "cosine"  # cosine | wsd | constant
    warmup_steps: int | None = None  # wins over warmup_fraction when set
    warmup_fraction: float = 0.02  # of total steps, used when warmup_steps is None
    min_lr_ratio: float = 0.1  # final lr = min_lr_ratio * lr (cosine, wsd)
    decay_fraction: float = 0.2  # wsd: the final fraction of steps that decays to min lr
    decay_shape: str = "linear"  # wsd decay: linear | cosine | sqrt

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"optim.{key}={getattr(self, key)!r}: {why}")

        for key in ("lr", "eps"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise bad(key, "must be a positive number")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise bad(key, "must be in [0, 1)")
        if self.grad_clip < 0:
            raise bad("grad_clip", "must be >= 0 (0 disables clipping)")
        if self.schedule not in SCHEDULES:
            raise bad("schedule", f"unknown schedule; choose one of {', '.join(SCHEDULES)}")
        if self.decay_shape not in DECAY_SHAPES:
            raise bad("decay_shape", f"unknown shape; choose one of {', '.join(DECAY_SHAPES)}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise bad("warmup_steps", "must be >= 0 or null (then warmup_fraction is used)")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise bad("warmup_fraction", "must be in [0, 1)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise bad("min_lr_ratio", "must be in [0, 1]")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise bad("decay_fraction", "must be in (0, 1]")

    def resolve_warmup(self, total_steps: int) -> int:
        """Warmup length in optimizer steps for a run of ``total_steps`` steps.

        A warmup as long as the run (``warmup_steps: 50`` in a 20-step smoke test) is capped at
        ``WARMUP_CAP`` of the run, so every preset runs short; ``warmup_note`` says so.
        """
        if self.warmup_steps is not None:
            warmup = self.warmup_steps
        else:
            warmup = round(self.warmup_fraction * total_steps)
        if warmup >= total_steps and total_steps > 0 and self.schedule != "constant":
            warmup = int(WARMUP_CAP * total_steps)
        return warmup

    def warmup_note(self, total_steps: int) -> str | None:
        """One line when ``resolve_warmup`` capped the configured warmup (None otherwise)."""
        asked = self.warmup_steps if self.warmup_steps is not None \
            else round(self.warmup_fraction * total_steps)
        got = self.resolve_warmup(total_steps)
        if got == asked:
            return None
        return (f"optim.warmup_steps resolves to {asked} but the run has {total_steps} steps: "
                f"warmup capped at {got} ({WARMUP_CAP:.0%} of the run)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OptimConfig":
        return from_dict_checked(cls, d, "optim")
