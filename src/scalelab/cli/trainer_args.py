"""Any Lightning Trainer argument and any callback from the command line.

- ``trainer.*``: the keys of ``TrainerSchema`` are typed; every other key added with ``+``
  (``+trainer.max_time=00:00:00:05``, ``+trainer.gradient_clip_algorithm=value``) goes to
  ``pytorch_lightning.Trainer`` unchanged. A mapping with ``_target_`` (a plugin, a profiler) is
  instantiated first. A name that is not a Trainer argument, or one that scalelab sets from
  its own keys, fails before any IO with one line naming the key to use instead.
- ``callbacks.*``: every entry that is a mapping with ``_target_`` is instantiated and added,
  as in lightning-hydra-template:
  ``+callbacks.early_stop='{_target_: pytorch_lightning.callbacks.EarlyStopping, monitor: val/loss}'``.
"""

from __future__ import annotations

import inspect
from typing import Any

from omegaconf import DictConfig, OmegaConf

# the callbacks.<name>={_target_: ...} entries live in cli/user_callbacks.py (kept importable from here)
from scalelab.cli.user_callbacks import check_user_callbacks, user_callback_nodes, user_callbacks  # noqa: F401

# Trainer arguments scalelab derives from its own keys: setting them directly would be ignored
# or fight the step-based run, so they are refused with the key that does the job.
MANAGED: dict[str, str] = {
    "accumulate_grad_batches": "train.micro_batch_size (accumulation = per-device batch / micro batch)",
    "gradient_clip_val": "optim.grad_clip",
    "val_check_interval": "train.val_every (optimizer steps)",
    "check_val_every_n_epoch": "train.val_every (optimizer steps)",
    "logger": "logger=mlflow | logger=none (and logger.*)",
    "callbacks": "callbacks.<name>={_target_: ...}",
    "default_root_dir": "paths.output_dir",
    "enable_checkpointing": "callbacks.checkpoint.enabled",
    "max_epochs": "train.max_steps / train.max_tokens (runs are step-based)",
}


def _trainer_params() -> set[str]:
    import pytorch_lightning as pl

    return set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}


def extra_trainer_keys(cfg: DictConfig) -> list[str]:
    """``trainer.*`` keys beyond the typed schema (added on the command line with ``+``)."""
    from scalelab.config.schema import TrainerSchema

    known = set(TrainerSchema.__dataclass_fields__)
    return [str(k) for k in cfg.trainer if str(k) not in known]


def check(cfg: DictConfig) -> None:
    """Fail before any IO on a trainer key Lightning would not take or scalelab overrides."""
    extra = extra_trainer_keys(cfg)
    params = _trainer_params() if extra else set()  # imports Lightning: only when asked
    for key in extra:
        if key in MANAGED:
            raise ValueError(f"trainer.{key} is set by scalelab; use {MANAGED[key]} instead")
        if key not in params:
            raise ValueError(
                f"trainer.{key} is not a pytorch_lightning.Trainer argument "
                f"(see `python -c 'import pytorch_lightning as pl; help(pl.Trainer)'`)"
            )
    check_user_callbacks(cfg)


def extra_trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """The extra ``trainer.*`` keys as Trainer keyword arguments (instantiating ``_target_``)."""
    from hydra.utils import instantiate

    out: dict[str, Any] = {}
    for key in extra_trainer_keys(cfg):
        node = cfg.trainer[key]
        if OmegaConf.is_config(node):
            out[key] = instantiate(node, _convert_="all")
        else:
            out[key] = node
    return out
