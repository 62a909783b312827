"""User callbacks: every ``callbacks.<name>={_target_: ...}`` entry (a preset from
conf/callbacks/ or one written inline), checked before any IO and instantiated by Hydra.

Lightning-free at import (it is loaded only to check an entry), so composing and validating a
config stays fast; the callback classes scalelab adds itself are in cli/callbacks.py.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf


def platform_keys() -> set[str]:
    """The ``callbacks.*`` keys scalelab itself reads (config/schema.py CallbacksSchema)."""
    from scalelab.config.schema import CallbacksSchema

    return set(CallbacksSchema.__dataclass_fields__)


def user_callback_nodes(cfg: DictConfig) -> dict[str, DictConfig]:
    """``callbacks.<name>`` entries that carry a ``_target_``, in config order."""
    out = {}
    for name in cfg.callbacks:
        node = cfg.callbacks[name]
        if OmegaConf.is_dict(node) and "_target_" in node:
            out[str(name)] = node
    return out


def check_user_callbacks(cfg: DictConfig) -> None:
    """Fail before any IO, with one line naming the key, on an entry that could not be built:
    no ``_target_``, a class that does not import or is no Callback, an argument it does not
    take, or one that would clash with the platform's own callbacks."""
    platform = platform_keys()
    for name in cfg.callbacks:
        node = cfg.callbacks[name]
        if node is None:  # `callbacks.early_stopping=null` drops a preset's entry (as in lightning-hydra-template)
            continue
        if str(name) not in platform and not (OmegaConf.is_dict(node) and "_target_" in node):
            raise ValueError(f"callbacks.{name} has no _target_: pick a preset "
                             f"(callbacks={name}, see conf/callbacks/) or give the class, "
                             f"'+callbacks.{name}={{_target_: pytorch_lightning.callbacks.EarlyStopping}}'")
    for name, node in user_callback_nodes(cfg).items():
        cls = _callback_class(name, str(node["_target_"]))
        _check_arguments(name, cls, [str(k) for k in node if not str(k).startswith("_")])
        _check_clash(cfg, name, cls)


def _locate(target: str) -> Any:
    """The object ``target`` names, resolved as ``hydra.utils.instantiate`` resolves a
    ``_target_``. Hydra logs a failure as an error of its own before raising; that record is
    dropped here, since the caller turns the failure into one line naming the key."""
    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")
    hydra_log.addFilter(_drop_record)
    try:
        return get_object(target)
    finally:
        hydra_log.removeFilter(_drop_record)


def _drop_record(record: logging.LogRecord) -> bool:
    return False


def _callback_class(name: str, target: str) -> type:
    key = f"callbacks.{name}._target_={target!r}"
    if "." not in target:
        raise ValueError(f"{key}: give the full class path, e.g. pytorch_lightning.callbacks.EarlyStopping")
    try:
        obj = _locate(target)
    except Exception as e:  # Hydra wraps the ImportError/AttributeError in a multi-line message
        raise ValueError(f"{key}: cannot import it ({_import_problem(target, e)})") from None
    import pytorch_lightning as pl  # only once there is an entry to check

    if not (inspect.isclass(obj) and issubclass(obj, pl.Callback)):
        raise ValueError(f"{key} is not a pytorch_lightning.Callback class")
    return obj


def _import_problem(target: str, error: Exception) -> str:
    """``module has no 'Name'`` when the module imports (a typo in the class name), else the
    import error itself (a typo in the module path, a missing package)."""
    import importlib

    module, _, attr = target.rpartition(".")
    try:
        importlib.import_module(module)
        return f"{module} has no {attr!r}"
    except Exception:
        cause = error.__cause__ or error
        return f"{type(cause).__name__}: {str(cause).splitlines()[0]}"


def _check_arguments(name: str, cls: type, keys: list[str]) -> None:
    try:
        inspect.signature(cls).bind(**dict.fromkeys(keys))
    except TypeError as e:
        raise ValueError(f"callbacks.{name} ({cls.__name__}): {e}") from None


def _check_clash(cfg: DictConfig, name: str, cls: type) -> None:
    from pytorch_lightning.callbacks import Checkpoint, ProgressBar

    if issubclass(cls, ProgressBar):
        raise ValueError(f"callbacks.{name}: scalelab draws its own progress bar "
                         "(callbacks.progress_bar.*, trainer.enable_progress_bar)")
    checkpointing = bool(cfg.callbacks.checkpoint.enabled) and not cfg.trainer.fast_dev_run
    if issubclass(cls, Checkpoint) and not checkpointing:
        raise ValueError(f"callbacks.{name} ({cls.__name__}) saves checkpoints, but checkpointing is off "
                         "(callbacks.checkpoint.enabled=false, callbacks=none, a debug recipe or "
                         "fast_dev_run): turn it on or drop the callback")


def user_callbacks(cfg: DictConfig) -> list[Any]:
    """Instantiate every ``callbacks.<name>={_target_: ...}`` entry, in config order."""
    from hydra.utils import instantiate

    return [instantiate(node, _convert_="all") for node in user_callback_nodes(cfg).values()]
