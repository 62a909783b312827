"""The Lightning Trainer of a run: its callbacks, its arguments, its strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from scalelab.cli import trainer_args
from scalelab.config.spec import RunSpec


def build_trainer(cfg: DictConfig, spec: RunSpec, tracker: Any, out_dir: Path,
                  meta: dict[str, Any], val_steps: list[int]) -> Any:
    """``pl.Trainer`` for ``spec``; ``val_steps`` collects the step of every validation.
    ``cfg`` is the composed config, for the ``+trainer.X`` / ``+callbacks.X`` extras."""
    import pytorch_lightning as pl

    callbacks = [*scalelab_callbacks(spec, out_dir, meta, val_steps),
                 *trainer_args.user_callbacks(cfg), *_pruning(cfg, tracker)]
    return pl.Trainer(**trainer_kwargs(cfg, spec, tracker, callbacks, out_dir))


def _pruning(cfg: DictConfig, tracker: Any) -> list[Any]:
    """An Optuna search's job (``optuna_trial``): report the val loss to its trial in the
    study's storage and stop when the pruner says so (training/pruning.py). The study's name,
    storage and pruner are the search's own (``hydra.sweeper``), whichever process runs this."""
    from scalelab.tracking import is_global_zero
    from scalelab.training.pruning import PruneOnValLoss, make_pruner, open_trial

    number = cfg.get("optuna_trial")
    search = HydraConfig.get().sweeper if HydraConfig.initialized() else None
    if number is None or search is None or search.get("pruner", "none") == "none" \
            or not str(search.get("_target_", "")).endswith(".OptunaSweeper"):
        return []
    trial = None
    if is_global_zero():  # one rank reports; its decision stops them all
        pruner = make_pruner(str(search.pruner), int(search.pruner_startup_trials),
                             int(search.pruner_warmup_steps))
        trial = open_trial(str(search.storage), str(search.study_name), int(number), pruner)

    def record(step: int, value: float) -> None:  # the run says truthfully why it ended early
        tracker.set_tags({"optuna.pruned_at_step": step, "optuna.trial": int(number)})

    return [PruneOnValLoss(trial, on_prune=record)]


def scalelab_callbacks(spec: RunSpec, out_dir: Path, meta: dict[str, Any],
                       val_steps: list[int]) -> list[Any]:
    from scalelab.cli.callbacks import RunRecorder

    cbs: list[Any] = [RunRecorder(meta, out_dir, val_steps)]
    cbs += _checkpoint_callbacks(spec, out_dir / "checkpoints")
    if spec.trainer.enable_progress_bar:
        from scalelab.cli.progress import progress_callback

        cbs.append(progress_callback(spec.callbacks.progress_bar))  # tqdm on a TTY, else lines
    if spec.train.save_at_steps and not spec.fast_dev_run:  # WSD branch points
        from scalelab.cli.callbacks import StepCheckpoints

        cbs.append(StepCheckpoints(out_dir / "checkpoints", list(spec.train.save_at_steps)))
    if spec.callbacks.throughput.enabled:  # tokens_per_sec, mfu, time to first step
        from scalelab.training import ThroughputMonitor

        window = spec.callbacks.throughput.window
        cbs.append(ThroughputMonitor(every_n_steps=None if window is None else int(window)))
    return cbs


def _checkpoint_callbacks(spec: RunSpec, ckpt_dir: Path) -> list[Any]:
    from pytorch_lightning.callbacks import ModelCheckpoint

    from scalelab.training.save_on_stop import SaveOnStop

    if not spec.saves_checkpoints:
        return []
    ck, cbs = spec.callbacks.checkpoint, []
    common = {"dirpath": ckpt_dir, "every_n_train_steps": int(ck.every_n_steps) if ck.every_n_steps else None,
              "auto_insert_metric_name": False, "enable_version_counter": False}
    if ck.save_best:
        cbs.append(ModelCheckpoint(filename="best", monitor=str(ck.monitor), mode="min",
                                   save_top_k=1, save_last=False, **common))
    if ck.save_last:
        # its own callback: Lightning writes save_last only on a step where a best/top-k
        # file was written, so with save_best=false (sweeps) or a loss that stops
        # improving, last.ckpt would never be refreshed
        cbs.append(ModelCheckpoint(filename="last", monitor=None, save_top_k=1,
                                   save_last=False, **common))
        cbs.append(SaveOnStop(ckpt_dir))  # on SIGTERM/Ctrl-C/SIGUSR1
    return cbs


def trainer_kwargs(cfg: DictConfig, spec: RunSpec, tracker: Any, callbacks: list[Any],
                   out_dir: Path) -> dict[str, Any]:
    from scalelab.training.checkpoint_io import VerifiedCheckpointIO

    trainer = spec.trainer
    accum = spec.batch.grad_accum
    return {
        "accelerator": str(trainer.accelerator), "devices": trainer.devices,
        "num_nodes": int(trainer.num_nodes),
        "strategy": _strategy(spec), "precision": str(trainer.precision),
        "max_steps": spec.max_steps, "max_epochs": -1,
        "accumulate_grad_batches": accum, "gradient_clip_val": spec.optim.grad_clip or None,
        # Lightning counts val_check_interval in micro-batches; val_every is in optimizer steps.
        "val_check_interval": spec.val_every * accum, "check_val_every_n_epoch": None,
        "limit_val_batches": trainer.limit_val_batches if trainer.limit_val_batches is not None
        else int(spec.train.val_batches),
        "limit_train_batches": trainer.limit_train_batches,
        "log_every_n_steps": int(trainer.log_every_n_steps),
        "enable_progress_bar": bool(trainer.enable_progress_bar),
        "enable_checkpointing": spec.saves_checkpoints, "enable_model_summary": False,
        "deterministic": trainer.deterministic,
        "num_sanity_val_steps": int(trainer.num_sanity_val_steps),
        "fast_dev_run": trainer.fast_dev_run, "overfit_batches": trainer.overfit_batches,
        "profiler": trainer.profiler, "detect_anomaly": bool(trainer.detect_anomaly),
        "benchmark": trainer.benchmark,
        "logger": tracker.lightning_logger(), "callbacks": callbacks,
        "default_root_dir": str(out_dir),
        "plugins": [VerifiedCheckpointIO()],  # temp file in place, fsync, rename, hash sidecar
        **trainer_args.extra_trainer_kwargs(cfg),  # any other Lightning argument (+trainer.X=...)
    }


def _strategy(spec: RunSpec) -> Any:
    """Lightning's strategy argument; for ddp/fsdp scalelab.training.distributed starts ranks > 0
    of this node, each re-running exactly this Hydra job (not the whole --multirun sweep)."""
    trainer = spec.trainer
    name = str(trainer.strategy)
    if name not in ("ddp", "fsdp"):
        return name
    from scalelab.cli.hydra_ddp import job_command
    from scalelab.training.distributed import build_strategy

    return build_strategy(
        name, str(trainer.accelerator),
        fsdp=dict(trainer.fsdp) or None, ddp=dict(trainer.ddp) or None,
        child_command=job_command if HydraConfig.initialized() else None,
        num_processes=spec.world_size // int(trainer.num_nodes), num_nodes=int(trainer.num_nodes),
    )
