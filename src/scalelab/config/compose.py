"""Compose a config of the package's conf/ in-process (Hydra's compose API: no run folder,
no chdir), as `scalelab-sweep` does for its base training config and the tests do."""

from __future__ import annotations

from omegaconf import DictConfig

from scalelab.config.schema import register
from scalelab.paths import conf_dir

# Groups that train.yaml lists as `NAME: null`: Hydra rejects `+NAME=x` for them ("Multiple
# values"), yet `+experiment=x` is the documented spelling, so both spellings are accepted.
NULL_DEFAULT_GROUPS = ("experiment", "debug", "hparams_search")


def normalize_overrides(argv: list[str]) -> list[str]:
    """`+experiment=x` -> `experiment=x` (same for debug); everything else unchanged."""
    out = []
    for arg in argv:
        for group in NULL_DEFAULT_GROUPS:
            if arg.startswith(f"+{group}="):
                arg = arg[1:]
        out.append(arg)
    return out


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """``config_name`` (train | sweep) with ``overrides``, the schema and resolvers registered."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=normalize_overrides(overrides))
