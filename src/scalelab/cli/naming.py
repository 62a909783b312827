"""The run's one name for this job (config/run_name.py makes it) and its multirun parent.

- a single run: ``run_name`` plus the command-line overrides that change the experiment, e.g.
  ``pystdlib_small,n_layers=6,lr=3e-4``; an explicit ``run_name=...`` wins;
- a ``--multirun`` job: the same from the job's own overrides, so it carries its swept values
  (``pystdlib_small,lr=1e-3``), under one parent run per multirun (tracking/multirun.py);
- a scaling-sweep point: the point's name (its ``sweep_point`` config sets ``run_name``).

The run folder gets the same name from the same function (conf/hydra/default.yaml).
"""

from __future__ import annotations

from scalelab.config.run_name import derive_run_name, is_explicit, meaningful_overrides
from scalelab.config.spec import RunSpec

run_name = derive_run_name  # the one function that names a run

__all__ = ["in_multirun", "meaningful_overrides", "multirun_parent", "resolve", "run_name"]


def resolve(spec: RunSpec) -> tuple[str, dict[str, str]]:
    """The run's name for this job and the tags that go with it.

    Reads Hydra's runtime config when there is one (the job's overrides)."""
    from hydra.core.hydra_config import HydraConfig

    base = str(spec.run_name)
    if not HydraConfig.initialized():
        return base, {}
    overrides = list(HydraConfig.get().overrides.task)
    tags: dict[str, str] = {}
    meaningful = meaningful_overrides(overrides)
    if spec.logger.parent_run_id:  # a scaling-sweep point: its config named it
        return base, {"scalelab.overrides": " ".join(overrides)}
    if in_multirun():
        tags["scalelab.overrides"] = " ".join(overrides)
    elif meaningful and not is_explicit(overrides):
        tags["scalelab.overrides"] = " ".join(meaningful)
    return derive_run_name(base, overrides), tags


def in_multirun() -> bool:
    """Whether this is a Hydra ``--multirun`` job (every scaling-sweep point is one)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def multirun_parent(spec: RunSpec, tracking_uri: str, base_name: str) -> str | None:
    """The parent run of this ``--multirun`` job (None for single runs and scaling sweeps)."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from scalelab.tracking.multirun import parent_run_id

    if spec.logger.parent_run_id or not in_multirun():
        return None
    hc = HydraConfig.get()
    return parent_run_id(tracking_uri, str(spec.logger.experiment_name), Path(hc.sweep.dir),
                         f"{base_name} (multirun)", spec.logger.artifact_root)
