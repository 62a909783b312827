"""Run names you can tell apart in the MLflow UI.

- a single run: ``run_name`` (the experiment's name) plus the command-line overrides that change
  the experiment, e.g. ``pystdlib_small,n_layers=6,lr=3e-4``; an explicit ``run_name=...`` wins;
- a ``--multirun`` job: ``<name>-<job number>``, with the job's overrides in the
  ``scalelab.overrides`` tag, under one parent run per multirun (tracking/multirun.py).

Scaling sweeps name their points themselves (``sweep_point`` overrides set ``run_name``).
"""

from __future__ import annotations

from scalelab.config.spec import RunSpec

# Overrides that say where or how a run is recorded, not what it trains.
_IGNORED_PREFIXES = (
    "hydra.", "hydra/", "paths.", "logger.", "logger=", "tags.", "+tags.", "resume=", "ckpt_path=",
    "run_name=", "experiment=", "+experiment=", "trainer.enable_progress_bar=",
    "callbacks.progress_bar.", "callbacks.sample.", "sweep_point=", "+sweep_point=",
)
MAX_LEN = 100


def _short(override: str) -> str:
    """``model.n_layers=6`` -> ``n_layers=6``; ``+trainer.max_time=x`` -> ``max_time=x``."""
    key, _, value = override.lstrip("+~").partition("=")
    return f"{key.rsplit('.', 1)[-1]}={value}" if value else key.rsplit(".", 1)[-1]


def meaningful_overrides(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.lstrip("~").startswith(_IGNORED_PREFIXES)
            and not o.startswith(_IGNORED_PREFIXES)]


def run_name(base: str, overrides: list[str]) -> str:
    """``base`` plus the short form of the overrides that matter (≤ MAX_LEN characters)."""
    parts = [_short(o) for o in meaningful_overrides(overrides)]
    name = ",".join([base, *parts])
    if len(name) > MAX_LEN:
        import hashlib

        digest = hashlib.sha1(name.encode()).hexdigest()[:6]
        name = name[: MAX_LEN - 8] + ".." + digest
    return name


def resolve(spec: RunSpec) -> tuple[str, dict[str, str]]:
    """The MLflow run name for this job and the tags that go with it.

    Reads Hydra's runtime config when there is one (job overrides, multirun job number).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    base = str(spec.run_name)
    if not HydraConfig.initialized():
        return base, {}
    hc = HydraConfig.get()
    overrides = list(hc.overrides.task)
    tags: dict[str, str] = {}
    explicit = any(o.lstrip("+").startswith("run_name=") for o in overrides)
    if hc.mode == RunMode.MULTIRUN:
        tags["scalelab.overrides"] = " ".join(overrides)
        if spec.logger.parent_run_id:  # a scaling sweep's point: its name is already its own
            return base, tags
        return f"{base}-{hc.job.num}", tags
    if explicit:
        return base, tags
    name = run_name(base, overrides)
    if name != base:
        tags["scalelab.overrides"] = " ".join(meaningful_overrides(overrides))
    return name, tags


def in_multirun() -> bool:
    """Whether this is a Hydra ``--multirun`` job (every scaling-sweep point is one)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def multirun_parent(spec: RunSpec, tracking_uri: str) -> str | None:
    """The parent run of this ``--multirun`` job (None for single runs and scaling sweeps)."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    from scalelab.tracking.multirun import parent_run_id

    if spec.logger.parent_run_id or not in_multirun():
        return None
    hc = HydraConfig.get()
    return parent_run_id(tracking_uri, str(spec.logger.experiment_name), Path(hc.sweep.dir),
                         f"{spec.run_name} (multirun)", spec.logger.artifact_root)
