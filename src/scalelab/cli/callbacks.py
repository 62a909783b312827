"""Platform callbacks (the run's checkpoint contents, validation steps and samples; the progress
bar; step checkpoints; early stopping that says why) and the user's: every ``callbacks.<name>`` entry with a ``_target_`` (a preset from ``conf/callbacks/``
or an inline ``+callbacks.<name>={_target_: ...}``), checked before any IO, then instantiated."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar

from scalelab.config.spec import plain
from scalelab.training.checkpoint import add_rng_state, add_run_meta, restore_rng_state

log = logging.getLogger("scalelab.train")


class RunRecorder(pl.Callback):
    """The run's own bookkeeping in one callback (Lightning calls every hook of every callback
    at each step, so one callback costs less than three):

    - every checkpoint gets what resume and `scalelab-sample` need, as plain types: the run
      meta (model config dict, tokenizer spec, objective, MLflow run id), the RNG states
      (torch, numpy, python; restored on resume so dropout/masking continue the same random
      stream), and ``hyper_parameters`` made plain so ``torch.load(weights_only=True)`` works;
    - ``val_steps`` collects the optimizer step of every validation;
    - each validation's text sample is written as ``samples/step_<N>.txt`` in the run folder
      and, when the logger can (MLflow), as a run artifact, so the UI shows samples improving.
    """

    def __init__(self, meta: dict[str, Any], out_dir: Path, val_steps: list[int]) -> None:
        self.meta, self.out_dir, self.val_steps = meta, out_dir, val_steps
        self.sampled_steps: set[int] = set()

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if "hyper_parameters" in checkpoint:
            checkpoint["hyper_parameters"] = plain(dict(checkpoint["hyper_parameters"]))
        add_run_meta(checkpoint, plain(self.meta))
        add_rng_state(checkpoint)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        restore_rng_state(checkpoint)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.val_steps.append(trainer.global_step)
        samples = getattr(pl_module, "samples", None)
        if trainer.is_global_zero and samples:
            self._write_sample(trainer, *samples[-1])

    def _write_sample(self, trainer: pl.Trainer, step: int, text: str) -> None:
        if step in self.sampled_steps:
            return
        self.sampled_steps.add(step)
        name = f"samples/step_{step:06d}.txt"
        (self.out_dir / "samples").mkdir(parents=True, exist_ok=True)
        (self.out_dir / name).write_text(text)
        log_text = getattr(trainer.logger, "log_text", None)
        if callable(log_text):
            log_text(text, name)


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
        self.dirpath = Path(dirpath)
        self.steps = sorted({int(s) for s in steps})
        self._saved: set[int] = set()

    def path(self, step: int) -> Path:
        return self.dirpath / f"step_{step}.ckpt"

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        # with gradient accumulation several micro-batches share one global_step: save once
        if step in self.steps and step not in self._saved:
            self._saved.add(step)
            trainer.save_checkpoint(self.path(step))


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
