"""The runner's keys of ``conf/sweep.yaml`` (``RunSettings``), and ``cfg.sweep`` split into the
planner's spec, the model family and these settings, with unknown keys named."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .sweep_spec import FamilyConfig, SweepSpec

LAUNCHERS = ("hydra", "subprocess")


@dataclass
class RunSettings:
    """The runner's keys of ``conf/sweep.yaml`` (the planner's are in SweepSpec/FamilyConfig)."""

    name: str = "sweep"
    plan_only: bool = False
    train_overrides: list[str] = field(default_factory=list)
    flops_convention: str = "attention"
    launcher: str = "hydra"
    hydra_launcher: str = "basic"
    launcher_overrides: list[str] = field(default_factory=list)
    val_evals: int = 12
    val_batches: int = 10
    # about this many rows of train metrics per point (see point_log_every)
    log_points: int = 100
    experiment_name: str | None = None
    output_dir: str | None = None
    estimate_time: bool = True
    run_overhead_s: float = 8.0
    fit: bool = True
    bootstrap: int = 200
    # every point's final loss on one fixed set of this many validation tokens (0: off, the
    # fits use each run's own final/val_loss); see scaling/heldout.py
    heldout_tokens: int = 0
    # a downstream task scored on every point (scaling/task_metric.py): this many held-out lines,
    # each with ``task_ending`` tokens to choose among four; 0: off. The forecast stage then
    # forecasts its accuracy in two steps (scaling/task_forecast.py)
    task_items: int = 0
    task_ending: int = 16

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"sweep.launcher={self.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        if self.flops_convention not in ("attention", "6n"):
            raise ValueError(f"sweep.flops_convention={self.flops_convention!r}: choose attention or 6n")
        if not self.name or any(c in self.name for c in "/\\ ,=") or self.name.startswith("."):
            # the folder is sweeps/<name>: "..", "../x" or ".x" would leave or hide it
            raise ValueError(f"sweep.name={self.name!r}: a folder-safe name (no / , = or spaces, "
                             "not starting with a dot)")
        if isinstance(self.heldout_tokens, bool) or int(self.heldout_tokens) < 0:
            raise ValueError(f"sweep.heldout_tokens={self.heldout_tokens!r}: a token count >= 0 "
                             "(0 turns the fixed held-out evaluation off)")
        self.heldout_tokens = int(self.heldout_tokens)
        for key, least in (("task_items", 0), ("task_ending", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"sweep.{key}={value!r}: an integer >= {least} "
                                 "(sweep.task_items=0 turns the task off)")
        if self.val_evals < 1 or self.val_batches < 1:
            raise ValueError("sweep.val_evals and sweep.val_batches must be >= 1")
        if isinstance(self.log_points, bool) or int(self.log_points) < 1:
            raise ValueError(f"sweep.log_points={self.log_points!r}: rows of train metrics per "
                             "point, an integer >= 1")
        self.log_points = int(self.log_points)
        self.train_overrides = [str(o) for o in self.train_overrides]
        self.launcher_overrides = [str(o) for o in self.launcher_overrides]


def split_settings(sweep: dict[str, Any]) -> tuple[SweepSpec, FamilyConfig, RunSettings]:
    """``cfg.sweep`` (a plain dict) -> the three config objects; unknown keys fail, named."""
    sweep = dict(sweep)
    family = FamilyConfig(**dict(sweep.pop("family", {}) or {}))
    run_keys = {f.name for f in dataclasses.fields(RunSettings)}
    spec_keys = SweepSpec.field_names()
    unknown = sorted(set(sweep) - run_keys - spec_keys)
    if unknown:
        raise ValueError(f"sweep: unknown key(s) {unknown}; valid keys are "
                         f"{sorted(run_keys | spec_keys | {'family'})}")
    spec = SweepSpec.from_dict({k: v for k, v in sweep.items() if k in spec_keys})
    if "name" in sweep:
        spec.name = str(sweep["name"])
    settings = RunSettings(**{k: v for k, v in sweep.items() if k in run_keys})
    return spec, family, settings
