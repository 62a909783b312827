"""Learning-rate schedules as multipliers ``step -> factor`` of the peak lr.

Used through ``torch.optim.lr_scheduler.LambdaLR`` with Lightning interval "step": the factor for
optimizer step ``s`` (0-based: the first update uses ``s = 0``) is what that update uses. Warmup
is linear from ``1/warmup`` at step 0 to 1.0 at step ``warmup`` (never 0, so the first update moves
the weights). Decays end *exactly* at ``min_lr_ratio`` on the last step, ``total_steps - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scalelab.training.config import OptimConfig

LrLambda = Callable[[int], float]


def _warmup(step: int, warmup: int) -> float:
    return (step + 1) / warmup


def _progress(step: int, start: int, last: int) -> float:
    """Fraction 0..1 of the way from step ``start`` to step ``last`` (inclusive ends)."""
    if last <= start:
        return 1.0
    return min(max((step - start) / (last - start), 0.0), 1.0)


def cosine_schedule(total_steps: int, warmup_steps: int, min_lr_ratio: float) -> LrLambda:
    """Linear warmup, then half a cosine from 1.0 (step ``warmup``) to ``min_lr_ratio`` (last step)."""
    _check(total_steps, warmup_steps)
    last = total_steps - 1

    def f(step: int) -> float:
        if step < warmup_steps:
            return _warmup(step, warmup_steps)
        p = _progress(step, warmup_steps, last)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))

    return f


def wsd_decay_start(total_steps: int, decay_fraction: float, warmup_steps: int) -> int:
    """First decaying step of a WSD run (the sweep planner branches cooldowns off it)."""
    return max(warmup_steps, total_steps - max(1, round(decay_fraction * total_steps)))


def wsd_schedule(
    total_steps: int,
    warmup_steps: int,
    min_lr_ratio: float,
    decay_fraction: float,
    decay_shape: str = "linear",
) -> LrLambda:
    """Warmup-stable-decay: warmup, hold 1.0, then decay over the final ``decay_fraction`` of steps.

    The decay starts at step ``total_steps - round(decay_fraction * total_steps)`` (at 1.0) and
    reaches ``min_lr_ratio`` on the last step. Shapes: linear, cosine, or sqrt (1 - sqrt(p)).
    """
    _check(total_steps, warmup_steps)
    last = total_steps - 1
    decay_start = wsd_decay_start(total_steps, decay_fraction, warmup_steps)
    shapes: dict[str, Callable[[float], float]] = {
        "linear": lambda p: 1.0 - p,
        "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
        "sqrt": lambda p: 1.0 - math.sqrt(p),
    }
    if decay_shape not in shapes:
        raise ValueError(f"optim.decay_shape={decay_shape!r}: choose one of {sorted(shapes)}")
    shape = shapes[decay_shape]

    def f(step: int) -> float:
        if step < warmup_steps:
            return _warmup(step, warmup_steps)
        if step < decay_start:
            return 1.0
        p = _progress(step, decay_start, last)
        return min_lr_ratio + (1.0 - min_lr_ratio) * shape(p)

    return f


def constant_schedule(warmup_steps: int) -> LrLambda:
    """Linear warmup, then 1.0 forever (no dependence on the run length)."""

    def f(step: int) -> float:
        if step < warmup_steps:
            return _warmup(step, warmup_steps)
        return 1.0

    return f


def build_lr_lambda(cfg: OptimConfig, total_steps: int) -> LrLambda:
    """The multiplier function for ``cfg.schedule`` over a run of ``total_steps`` optimizer steps."""
    if total_steps < 1:
        raise ValueError(
            f"total_steps={total_steps}: the schedule needs the run length in optimizer steps (>= 1); "
            "set trainer.max_steps or a token budget"
        )
    warmup = cfg.resolve_warmup(total_steps)
    if cfg.schedule == "cosine":
        return cosine_schedule(total_steps, warmup, cfg.min_lr_ratio)
    if cfg.schedule == "wsd":
        return wsd_schedule(total_steps, warmup, cfg.min_lr_ratio, cfg.decay_fraction, cfg.decay_shape)
    if cfg.schedule == "constant":
        return constant_schedule(warmup)
    raise ValueError(f"optim.schedule={cfg.schedule!r}: choose cosine, wsd or constant")


# --- a resumed run whose length changed --------------------------------------------------------
# A run's lr curve is a list of segments (first step, length); each is a whole schedule of its own
# and the last holds its final factor past its end. A fresh run has one: [(0, max_steps)].
Segments = list[tuple[int, int]]
RESUME_SCHEDULES = ("continue", "restart", "replan")


def planned_end(segments: Segments) -> int:
    """The step where the planned curve ends (the run length it was laid out for)."""
    start, length = segments[-1]
    return start + length


def extended_segments(segments: Segments, total_steps: int, mode: str | None) -> Segments:
    """The curve of a resumed run that now has ``total_steps`` steps.

    ``continue`` keeps the curve (past its end, the final lr holds); ``restart`` adds a new
    warmup + decay over the added steps; ``replan`` stretches the last segment to the new end.
    """
    end = planned_end(segments)
    if total_steps == end:
        return list(segments)
    if mode == "continue":
        return list(segments)
    if mode == "restart" and total_steps > end:
        return [*segments, (end, total_steps - end)]
    if mode == "replan":
        start = segments[-1][0]
        return [*segments[:-1], (start, total_steps - start)]
    raise ValueError(f"train.resume_schedule={mode!r}: choose one of {', '.join(RESUME_SCHEDULES)}"
                     + (" (restart needs more steps than planned)" if mode == "restart" else ""))


def segmented_lr_lambda(cfg: OptimConfig, segments: Segments) -> LrLambda:
    """``build_lr_lambda`` per segment, each counted from its own first step."""
    curves = [(start, build_lr_lambda(cfg, length)) for start, length in segments]

    def f(step: int) -> float:
        start, curve = curves[0]
        for s, c in curves[1:]:
            if step >= s:
                start, curve = s, c
        return curve(step - start)

    return f


def _check(total_steps: int, warmup_steps: int) -> None:
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps}: must be >= 1")
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"warmup_steps={warmup_steps} must be in [0, total_steps={total_steps}); "
            "lower optim.warmup_steps or train longer"
        )
