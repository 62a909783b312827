"""Platform callbacks (checkpoint contents for resume/sampling, the progress bar) and the
user's: every ``callbacks.<name>`` entry with a ``_target_`` (a preset from ``conf/callbacks/``
or an inline ``+callbacks.<name>={_target_: ...}``), checked before any IO, then instantiated."""

from __future__ import annotations

import inspect
import logging
import random
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import TQDMProgressBar

from scalelab.cli.spec import plain

log = logging.getLogger("scalelab.train")


class RunState(pl.Callback):
    """Adds what resume and `scalelab-sample` need to every checkpoint, as plain types.

    - ``checkpoint["scalelab_run"]``: model config dict, tokenizer spec, objective, MLflow run id;
    - RNG states (torch, numpy, python), restored on resume so dropout/masking continue the
      same random stream;
    - ``hyper_parameters`` made plain so ``torch.load(weights_only=True)`` works.
    """

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint["scalelab_run"] = plain(self.meta)
        np_state = np.random.get_state()
        checkpoint["scalelab_rng"] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [str(np_state[0]), torch.from_numpy(np_state[1].astype(np.int64)),
                      int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "python": plain(random.getstate()),
        }
        if "hyper_parameters" in checkpoint:
            checkpoint["hyper_parameters"] = plain(dict(checkpoint["hyper_parameters"]))

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        rng = checkpoint.get("scalelab_rng")
        if not rng:
            return
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        version, state, gauss = rng["python"]
        random.setstate((version, tuple(state), gauss))


class ProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar showing loss, tokens/s and lr (short names, no v_num)."""

    SHOW: ClassVar[dict[str, str]] = {"train/loss": "loss", "val/loss": "val", "lr": "lr"}

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        cm = trainer.callback_metrics
        shown: dict[str, Any] = {}
        for key, value in {**{k: v for k, v in cm.items()}, **items}.items():
            short = self.SHOW.get(key)
            if short is None and ("tokens_per_s" in key or "tok_s" in key or "tokens/s" in key):
                short = "tok/s"
            if short is None and key.endswith("mfu"):
                short = "mfu"
            if short is None:
                continue
            v = float(value.item() if hasattr(value, "item") else value)
            shown[short] = f"{v:.0f}" if short == "tok/s" else f"{v:.3g}" if short in ("lr", "mfu") else f"{v:.4f}"
        return shown


class StepCheckpoints(pl.Callback):
    """Saves ``<dirpath>/step_<N>.ckpt`` (full state) when the optimizer step count reaches N.

    For WSD cooldown branches (``train.save_at_steps``): a branch run starts from the stable
    phase at step N with ``train.init_from``. Saved in ``on_train_batch_end`` like Lightning's
    ModelCheckpoint(every_n_train_steps), so resuming from it continues with the next batch.
    """

    def __init__(self, dirpath: Any, steps: list[int]) -> None:
        from pathlib import Path

        self.dirpath = Path(dirpath)
        self.steps = sorted({int(s) for s in steps})
        self._saved: set[int] = set()

    def path(self, step: int) -> Any:
        return self.dirpath / f"step_{step}.ckpt"

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        # with gradient accumulation several micro-batches share one global_step: save once
        if step in self.steps and step not in self._saved:
            self._saved.add(step)
            trainer.save_checkpoint(self.path(step))


class SampleArtifacts(pl.Callback):
    """Each validation's text sample as ``samples/step_<N>.txt``: in the run folder and, when
    the logger can (MLflow), as a run artifact, so the UI shows the samples improving."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._logged: set[int] = set()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        samples = getattr(pl_module, "samples", None)
        if trainer.sanity_checking or not trainer.is_global_zero or not samples:
            return
        step, text = samples[-1]
        if step in self._logged:
            return
        self._logged.add(step)
        name = f"samples/step_{step:06d}.txt"
        (self.out_dir / "samples").mkdir(parents=True, exist_ok=True)
        (self.out_dir / name).write_text(text)
        log_text = getattr(trainer.logger, "log_text", None)
        if callable(log_text):
            log_text(text, name)


class EarlyStopping(pl.callbacks.EarlyStopping):
    """Lightning's EarlyStopping that also says why it stopped the run: one line on the console
    and in train.log, and the MLflow run's tag ``scalelab.stopped_early`` (the run ends FINISHED)."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        reason = self.stopping_reason_message  # set only when it stopped the run
        if not reason or not trainer.is_global_zero:
            return
        line = f"stopped early at step {trainer.global_step}: {reason}"
        log.info(line)
        logger = trainer.logger
        run_id = getattr(logger, "run_id", None)
        if run_id and hasattr(logger, "experiment"):  # MLflow (or any client with set_tag)
            logger.experiment.set_tag(run_id, "scalelab.stopped_early", line[:5000])


# --- user callbacks: `callbacks.<name>={_target_: ...}` ---------------------------------------
def platform_keys() -> set[str]:
    """The ``callbacks.*`` keys scalelab itself reads (cli/schema.py CallbacksSchema)."""
    from scalelab.cli.schema import CallbacksSchema

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


def _callback_class(name: str, target: str) -> type:
    # what hydra.utils.instantiate resolves _target_ with; hydra.utils.get_object would also
    # log the failure as three more lines before our one
    from hydra._internal.utils import _locate

    key = f"callbacks.{name}._target_={target!r}"
    if "." not in target:
        raise ValueError(f"{key}: give the full class path, e.g. pytorch_lightning.callbacks.EarlyStopping")
    try:
        obj = _locate(target)
    except Exception as e:  # Hydra wraps the ImportError/AttributeError in a multi-line message
        raise ValueError(f"{key}: cannot import it ({_import_problem(target, e)})") from None
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
