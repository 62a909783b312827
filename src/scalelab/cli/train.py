"""`scalelab-train`: train one transformer, checkpoint it, and track it in MLflow.

    scalelab-train                                   # the default experiment (pystdlib_small)
    scalelab-train +experiment=shakespeare_char data.path=/path/tinyshakespeare.txt
    scalelab-train model=llama_tiny model.n_layers=6 optim.lr=3e-4 trainer.max_steps=500
    scalelab-train --cfg job                         # print the composed config
    scalelab-train resume=true run_name=NAME         # continue the latest run named NAME

Order of work: validate every config (no IO) -> probe the tracking server -> prepare data ->
create/reopen the MLflow run -> fit -> final validation, sample, artifacts, summary.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from scalelab.cli import (
    hydra_ddp,
    run_folder,
    schema,  # noqa: F401  (registers train_schema and the resolvers)
    trainer_args,
)
from scalelab.cli.resume import check_resume_point, resume_point
from scalelab.cli.run_folder import RunFolder
from scalelab.cli.spec import RunSpec, build_spec
from scalelab.files import atomic_write_json, atomic_write_text
from scalelab.tracking import is_global_zero
from scalelab.tracking.store import TrackingServerUnreachable

log = logging.getLogger("scalelab.train")
RUN_ID_FILE = "mlflow_run_id"  # <run folder>/mlflow_run_id: what resume reopens
SUMMARY_FILE = "summary.json"  # <run folder>/summary.json: final metrics, run id, status


# Groups that train.yaml lists as `NAME: null`: Hydra rejects `+NAME=x` for them ("Multiple
# values"), yet `+experiment=x` is the documented spelling, so both spellings are accepted.
_NULL_DEFAULT_GROUPS = ("experiment", "debug")


def normalize_overrides(argv: list[str]) -> list[str]:
    """`+experiment=x` -> `experiment=x` (same for debug); everything else unchanged."""
    out = []
    for arg in argv:
        for group in _NULL_DEFAULT_GROUPS:
            if arg.startswith(f"+{group}="):
                arg = arg[1:]
        out.append(arg)
    return out


def main() -> None:
    """Console entry point (`scalelab-train`); the console script does sys.exit(main())."""
    sys.argv = [sys.argv[0], *normalize_overrides(sys.argv[1:])]
    sys.argv = hydra_ddp.torchrun_argv(sys.argv)  # scale-out: torchrun ranks > 0 use rank 0's folder
    _hydra_main()


@hydra.main(version_base="1.3", config_path="pkg://scalelab.conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> Optional[float]:  # noqa: UP045
    """Hydra task; returns the final val loss (what a Hydra sweeper would minimize)."""
    hydra_ddp.begin_job(cfg)  # scale-out: torchrun layout, one GPU per joblib job
    try:
        summary = train(cfg)
    except (ValueError, OSError, TrackingServerUnreachable) as e:
        # Config and input errors: one clear line instead of a traceback (single runs only:
        # in a --multirun the launcher records the failure and goes on with the other points).
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
    finally:
        hydra_ddp.end_job()  # scale-out: join this job's ranks, reset the env for the next job
    return summary.get("final_val_loss")


# --- the run ------------------------------------------------------------------------------
def train(cfg: DictConfig) -> dict[str, Any]:
    """Run one training job from a composed config; returns the summary dict."""
    from scalelab.training.signals import STOP

    STOP.install()  # SIGTERM/SIGINT/SIGUSR1: stop at a step boundary, checkpoint, KILLED
    try:
        return _train(cfg)
    finally:
        STOP.uninstall()


def _train(cfg: DictConfig) -> dict[str, Any]:
    t_start = time.time()
    rank0 = is_global_zero()
    out_dir = _output_dir(cfg)
    folder = RunFolder(out_dir)
    try:  # check everything before touching the folder, its config or any MLflow run
        from scalelab.training.signals import is_slurm_requeue

        run_folder.raise_deferred(out_dir)
        spec = build_spec(cfg)  # every config error surfaces here, before any IO
        _check_branch_keys(cfg, spec)
        _check_precision(cfg)
        trainer_args.check(cfg)  # +trainer.<any Lightning arg>, +callbacks.<name>={_target_: ...}
        cfg.paths.output_dir = str(out_dir)  # the saved config names the folder actually used
        if is_slurm_requeue() and not cfg.ckpt_path and (out_dir / "checkpoints" / "last.ckpt").exists():
            cfg.resume = True  # SLURM started this job again after a requeue: continue it
        point = resume_point(cfg, out_dir)
        ckpt_path, resume_run_id = point.ckpt, point.run_id

        tracking_uri = None
        if cfg.logger.backend == "mlflow" and rank0:
            from scalelab.tracking.run import remote_env_defaults
            from scalelab.tracking.store import probe, resolve_tracking_uri

            tracking_uri = resolve_tracking_uri(cfg.logger.tracking_uri, Path(cfg.paths.root))
            remote_env_defaults()
            probe(tracking_uri, timeout=float(cfg.logger.probe_timeout))  # dead server: fail now

        import pytorch_lightning as pl

        _torch_setup(cfg)
        pl.seed_everything(int(cfg.seed), workers=True, verbose=False)

        from scalelab.cli.banner import stdout_to_log

        with stdout_to_log():  # the data-preparation messages also reach train.log
            data = _build_data(cfg, spec, rank0)
        if isinstance(cfg.trainer.overfit_batches, int) and cfg.trainer.overfit_batches > 0:
            data["datamodule"].pin_batches(int(cfg.trainer.overfit_batches))  # really one batch
        model_cfg = spec.with_vocab(data["vocab_size"])
        check_resume_point(point, cfg, out_dir, max_steps=spec.max_steps,
                           model_config=model_cfg.to_dict(), objective=spec.objective,
                           tokenizer=data["tokenizer_spec"])
    except BaseException:
        if rank0:
            folder.abandon()
        raise
    if rank0:
        out_dir.mkdir(parents=True, exist_ok=True)
        folder.commit()

    tracker = _start_tracker(cfg, spec, tracking_uri, resume_run_id, rank0)
    if rank0:
        from scalelab.cli.banner import print_start

        print_start(getattr(tracker, "run_name", None) or str(cfg.run_name), out_dir, tracker,
                    model_cfg, spec, data, ckpt_path)

    try:
        if rank0 and tracker.run_id:
            atomic_write_text(out_dir / RUN_ID_FILE, tracker.run_id + "\n")
        summary = _tracked_run(cfg, spec, model_cfg, data, tracker, out_dir, ckpt_path, t_start)
    except BaseException as e:
        from scalelab.cli.stopping import on_stop

        status = "KILLED" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "FAILED"
        tracker.end(status)  # no-op if the status guard closed it; covers errors before it
        stop = on_stop(cfg, out_dir, tracker, e, rank0)
        if rank0:  # sweeps read the folder's outcome without MLflow
            with contextlib.suppress(OSError):  # a full disk must not hide the real error
                atomic_write_json(out_dir / SUMMARY_FILE, {
                    "status": status, "run_id": tracker.run_id, "output_dir": str(out_dir),
                    "error": f"{type(e).__name__}: {e}", **(stop[0] if stop else {}),
                })
        if stop is not None:
            raise stop[1] from None  # exit code 128 + signal (143 for SIGTERM, 130 for Ctrl-C)
        raise
    if rank0:
        summary["status"] = "FINISHED"
        atomic_write_json(out_dir / SUMMARY_FILE, summary)
        _print_summary(cfg, summary)
    return summary


def _tracked_run(cfg: DictConfig, spec: RunSpec, model_cfg: Any, data: dict[str, Any], tracker: Any,
                 out_dir: Path, ckpt_path: Optional[Path], t_start: float) -> dict[str, Any]:  # noqa: UP045
    """Params, config, fit and finish, inside the tracker's status guard."""
    import pytorch_lightning as pl

    with tracker.status_guard():
        if not tracker.resumed:
            tracker.log_params(_params(cfg, spec, model_cfg, data))
        _log_config(tracker, cfg)
        if cfg.logger.system_metrics:
            tracker.start_system_metrics(float(cfg.logger.system_metrics_interval))

        module = _build_module(cfg, spec, model_cfg, data)
        meta = {
            "model_config": model_cfg.to_dict(),
            "objective": spec.objective,
            "tokenizer": data["tokenizer_spec"],
            "block_size": spec.block_size,
            "data": spec.data.name,
            "mlflow_run_id": tracker.run_id,
            "run_name": cfg.run_name,
        }
        val_steps: list[int] = []
        callbacks = _callbacks(cfg, spec, model_cfg, data, out_dir, meta, val_steps)
        trainer = pl.Trainer(**_trainer_kwargs(cfg, spec, tracker, callbacks, out_dir))
        t_fit = time.time()
        trainer.fit(module, datamodule=data["datamodule"], ckpt_path=str(ckpt_path) if ckpt_path else None)
        fit_seconds = time.time() - t_fit
        _stop_if_signalled(cfg, trainer, out_dir)
        if trainer.interrupted:
            raise KeyboardInterrupt  # Lightning swallowed Ctrl-C: record the run as KILLED

        return _finish(cfg, spec, model_cfg, data, trainer, module, tracker, out_dir,
                       val_steps, fit_seconds, t_start, resumed_from=ckpt_path)


def _stop_if_signalled(cfg: DictConfig, trainer: Any, out_dir: Path) -> None:
    """A signal that came during the last step (or validation) still stops the run, after a
    checkpoint of the state it reached."""
    from scalelab.training.signals import STOP

    if STOP.signum is not None and cfg.callbacks.checkpoint.enabled and not cfg.trainer.fast_dev_run:
        trainer.save_checkpoint(out_dir / "checkpoints" / "last.ckpt")
    STOP.raise_if_stopped()


# --- pieces ---------------------------------------------------------------------------------
def _output_dir(cfg: DictConfig) -> Path:
    if cfg.paths.output_dir:
        return Path(cfg.paths.output_dir).expanduser().resolve()
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir).resolve()
    raise ValueError("paths.output_dir is not set (needed when not running under Hydra)")


def _check_branch_keys(cfg: DictConfig, spec: RunSpec) -> None:
    """train.save_at_steps / train.init_from: bad values fail before any IO."""
    bad = [int(s) for s in cfg.train.get("save_at_steps") or [] if not 1 <= int(s) <= spec.max_steps]
    if bad:
        raise ValueError(f"train.save_at_steps={list(cfg.train.save_at_steps)}: steps {bad} are "
                         f"outside 1..{spec.max_steps} (the run's optimizer steps)")
    if cfg.train.get("init_from") and not (cfg.resume or cfg.ckpt_path):
        step = module_start_step(Path(str(cfg.train.init_from)).expanduser())
        if step >= spec.max_steps:
            raise ValueError(f"train.init_from={cfg.train.init_from} is at step {step}, but the run "
                             f"has only {spec.max_steps} steps; raise train.max_steps")


class _DropNoise(logging.Filter):
    """Lightning start-up chatter that says nothing about this run."""

    NOISE = ("litlogger", "GPU available", "TPU available", "`weights_only` was not set",
             "HPU available", "LOCAL_RANK:")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(n in msg for n in self.NOISE)


def _quiet_lightning() -> None:
    import warnings

    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                 "pytorch_lightning.trainer.connectors.checkpoint_connector"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in lg.filters):
            lg.addFilter(_DropNoise())
    # our IterableDataset streams are single-process and sized on purpose
    warnings.filterwarnings("ignore", message=r".*IterableDataset.*has `__len__` defined")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # Lightning only asks whether the DataLoader object is `_Stateful`; our DataModules save
    # and restore the exact stream position themselves (DataModule.state_dict in
    # data/datamodules.py, stored in every checkpoint), so a mid-epoch resume is exact.
    warnings.filterwarnings("ignore", message=r".*dataloader is not resumable")
    logging.captureWarnings(True)  # the warnings that remain reach train.log too
    if logging.getLogger().handlers:
        # Lightning imported before logging was configured keeps a private stderr handler;
        # hand its records to the root logger (console + train.log) instead.
        for name in ("pytorch_lightning", "lightning_fabric"):
            lg = logging.getLogger(name)
            for h in [h for h in lg.handlers if type(h) is logging.StreamHandler]:
                lg.removeHandler(h)
            lg.propagate = True


def _check_precision(cfg: DictConfig) -> None:
    import torch

    from scalelab.runtime import check_cpu_precision

    check_cpu_precision(str(cfg.trainer.precision), str(cfg.trainer.accelerator),
                        torch.cuda.is_available())


def _torch_setup(cfg: DictConfig) -> None:
    import torch

    _quiet_lightning()

    from scalelab.runtime import thread_plan

    # null: cores // processes sharing them (SCALELAB_CONCURRENT_PROCS), fewer on a busy machine
    torch.set_num_threads(int(cfg.train.num_threads or thread_plan().threads))
    torch.set_float32_matmul_precision(str(cfg.train.matmul_precision))


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
               errno.EEXIST)


def _build_data(cfg: DictConfig, spec: RunSpec, rank0: bool) -> dict[str, Any]:
    """The DataModule for the objective plus vocab size, tokenizer spec, bytes per token."""
    import scalelab.data as D

    micro = spec.batch.micro_batch
    if spec.objective == "seq2seq":
        dm = D.Seq2SeqDataModule(spec.data, batch_size=micro, seed=int(cfg.seed))
        vocab = dm.vocab
        return {
            "datamodule": dm, "vocab_size": int(dm.vocab_size), "tokenizer": vocab,
            "tokenizer_spec": {"kind": "seq2seq_char", "name": "seq2seq_char", "chars": vocab.chars},
            "bytes_per_token": 1.0, "prepared": None,
        }
    try:
        prepared = D.prepare(spec.data, spec.tokenizer, cache_dir=Path(cfg.paths.data_dir), progress=rank0)
    except OSError as e:
        if e.errno not in _UNWRITABLE:
            raise
        raise ValueError(f"paths.data_dir={cfg.paths.data_dir}: cannot write the token cache "
                         f"({e.strerror}: {e.filename}); set paths.data_dir to a writable folder "
                         "with free space") from e
    if spec.objective == "mlm":
        dm = D.MaskedLMDataModule(prepared, block_size=spec.block_size, batch_size=micro,
                                  seed=int(cfg.seed), val_batches=int(cfg.train.val_batches))
    else:
        dm = D.CausalLMDataModule(prepared, block_size=spec.block_size, batch_size=micro,
                                  seed=int(cfg.seed), val_batches=int(cfg.train.val_batches))
    tok_spec = {"kind": "prepared", "dir": str(prepared.dir), **prepared.meta.get("tokenizer", {})}
    return {
        "datamodule": dm, "vocab_size": int(prepared.vocab_size), "tokenizer": prepared.tokenizer,
        "tokenizer_spec": tok_spec, "bytes_per_token": float(prepared.bytes_per_token),
        "prepared": prepared,
    }


def _start_tracker(cfg: DictConfig, spec: RunSpec, uri: Optional[str],  # noqa: UP045
                   resume_run_id: Optional[str], rank0: bool) -> Any:  # noqa: UP045
    from scalelab.tracking.run import NullTracker

    if not rank0 or cfg.logger.backend != "mlflow" or cfg.trainer.fast_dev_run:
        return NullTracker()
    from scalelab.tracking.meta import run_tags
    from scalelab.tracking.run import Tracker

    tags = run_tags(Path(cfg.paths.root))
    tags.update({
        "scalelab.objective": spec.objective,
        "scalelab.output_dir": str(cfg.paths.output_dir),
        "scalelab.data": spec.data.name,
        "scalelab.tokenizer": spec.tokenizer.name,
    })
    tags.update({str(k): str(v) for k, v in (cfg.tags or {}).items()})
    assert uri is not None
    from scalelab.cli import naming

    run_name, name_tags = naming.resolve(cfg)  # experiment + overrides; <name>-<job> in a multirun
    tags.update(name_tags)
    multirun_parent = None if resume_run_id else naming.multirun_parent(cfg, uri)
    tracker = Tracker.start(
        tracking_uri=uri,
        experiment_name=str(cfg.logger.experiment_name),
        run_name=run_name,
        tags=tags,
        artifact_root=cfg.logger.artifact_root,
        parent_run_id=cfg.logger.parent_run_id or multirun_parent,
        resume_run_id=resume_run_id,
        probe_timeout=float(cfg.logger.probe_timeout),
        folder=Path(cfg.paths.output_dir),
        outage_wait_s=float(cfg.logger.get("outage_wait_s", 120.0)),
    )
    tracker.multirun_parent_id = multirun_parent
    return tracker


def _params(cfg: DictConfig, spec: RunSpec, model_cfg: Any, data: dict[str, Any]) -> dict[str, Any]:
    from scalelab.tracking.params import run_params

    o = spec.optim
    return run_params(
        model_cfg,
        objective=spec.objective,
        seq_len=spec.block_size,
        max_steps=spec.max_steps,
        tokens_per_step=spec.batch.tokens_per_step,
        global_batch_sequences=spec.batch.global_batch_sequences,
        micro_batch=spec.batch.micro_batch,
        grad_accum=spec.batch.grad_accum,
        world_size=spec.world_size,
        strategy=str(cfg.trainer.strategy),
        precision=str(cfg.trainer.precision),
        lr=o.lr,
        tokenizer=spec.tokenizer.name if spec.objective != "seq2seq" else "seq2seq_char",
        dataset=spec.data.name,
        seed=int(cfg.seed),
        extra={
            "max_seq_len": model_cfg.max_seq_len,
            "weight_decay": o.weight_decay, "beta1": o.beta1, "beta2": o.beta2,
            "schedule": o.schedule, "warmup": o.resolve_warmup(spec.max_steps),
            "min_lr_ratio": o.min_lr_ratio, "grad_clip": o.grad_clip,
            "batch_unit": str(cfg.train.batch_unit), "run_name": str(cfg.run_name),
            "compile": bool(cfg.train.compile),
            "data_task": spec.data.task if spec.objective == "seq2seq" else None,
            "config_hash": _config_hash(cfg),
        },
    )


def _config_hash(cfg: DictConfig) -> str:
    """Hash of the resolved config minus where/how it runs: equal hash = same experiment."""
    import hashlib

    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    for key in ("paths", "logger", "resume", "ckpt_path", "tags"):
        c.pop(key, None)
    c.get("trainer", {}).pop("enable_progress_bar", None)
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _log_config(tracker: Any, cfg: DictConfig) -> None:
    tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/config.yaml")
    overrides: list[str] = []
    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    tracker.log_text("\n".join(overrides) + "\n", "config/overrides.txt")


def _build_module(cfg: DictConfig, spec: RunSpec, model_cfg: Any, data: dict[str, Any]) -> Any:
    from scalelab.cli.modules import build_module

    return build_module(cfg, spec, model_cfg, data)


def _callbacks(cfg: DictConfig, spec: RunSpec, model_cfg: Any, data: dict[str, Any],
               out_dir: Path, meta: dict[str, Any], val_steps: list[int]) -> list[Any]:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from scalelab.cli.callbacks import RunState, SampleArtifacts
    from scalelab.cli.modules import training_callbacks
    from scalelab.training.signals import SaveOnStop

    class _ValSteps(pl.Callback):
        def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if not trainer.sanity_checking:
                val_steps.append(trainer.global_step)

    cbs: list[Any] = [RunState(meta), _ValSteps(), SampleArtifacts(out_dir)]
    ck = cfg.callbacks.checkpoint
    if ck.enabled and not cfg.trainer.fast_dev_run:
        every = int(ck.every_n_steps) if ck.every_n_steps else None
        common = {"dirpath": out_dir / "checkpoints", "every_n_train_steps": every,
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
            cbs.append(SaveOnStop(out_dir / "checkpoints"))  # on SIGTERM/Ctrl-C/SIGUSR1
    if cfg.trainer.enable_progress_bar:
        from scalelab.cli.progress import progress_callback

        cbs.append(progress_callback(cfg))  # tqdm on a TTY, one plain line per N steps otherwise
    if cfg.train.get("save_at_steps") and not cfg.trainer.fast_dev_run:
        from scalelab.cli.callbacks import StepCheckpoints

        cbs.append(StepCheckpoints(out_dir / "checkpoints", list(cfg.train.save_at_steps)))
    cbs.extend(training_callbacks(cfg, spec, model_cfg, data))
    cbs.extend(trainer_args.user_callbacks(cfg))
    return cbs


def _trainer_kwargs(cfg: DictConfig, spec: RunSpec, tracker: Any, callbacks: list[Any],
                    out_dir: Path) -> dict[str, Any]:
    from scalelab.training.checkpoint import VerifiedCheckpointIO

    t = cfg.trainer
    accum = spec.batch.grad_accum
    limit_val = t.limit_val_batches if t.limit_val_batches is not None else int(cfg.train.val_batches)
    return {
        "accelerator": str(t.accelerator),
        "devices": t.devices if not OmegaConf.is_config(t.devices) else list(t.devices),
        "num_nodes": int(t.num_nodes),
        "strategy": _strategy(cfg),
        "precision": str(t.precision),
        "max_steps": spec.max_steps,
        "max_epochs": -1,
        "accumulate_grad_batches": accum,
        "gradient_clip_val": spec.optim.grad_clip or None,
        # Lightning counts val_check_interval in micro-batches; val_every is in optimizer steps.
        "val_check_interval": spec.val_every * accum,
        "check_val_every_n_epoch": None,
        "limit_val_batches": limit_val,
        "limit_train_batches": t.limit_train_batches,
        "log_every_n_steps": int(t.log_every_n_steps),
        "enable_progress_bar": bool(t.enable_progress_bar),
        "enable_checkpointing": bool(cfg.callbacks.checkpoint.enabled) and not t.fast_dev_run,
        "enable_model_summary": False,
        "deterministic": t.deterministic,
        "num_sanity_val_steps": int(t.num_sanity_val_steps),
        "fast_dev_run": t.fast_dev_run,
        "overfit_batches": t.overfit_batches,
        "profiler": t.profiler,
        "detect_anomaly": bool(t.detect_anomaly),
        "benchmark": t.benchmark,
        "logger": tracker.lightning_logger(),
        "callbacks": callbacks,
        "default_root_dir": str(out_dir),
        "plugins": [VerifiedCheckpointIO()],  # temp file in place, fsync, rename, hash sidecar
        **trainer_args.extra_trainer_kwargs(cfg),  # any other Lightning argument (+trainer.X=...)
    }


def _strategy(cfg: DictConfig) -> Any:
    """Lightning's strategy argument; ddp/fsdp go through scalelab.training.distributed so ranks
    > 0 re-run exactly this Hydra job (not the whole --multirun sweep)."""
    t = cfg.trainer
    name = str(t.strategy)
    if name not in ("ddp", "fsdp"):
        return name
    from scalelab.cli.hydra_ddp import job_command
    from scalelab.training.distributed import build_strategy

    return build_strategy(
        name, str(t.accelerator),
        fsdp=OmegaConf.to_container(t.fsdp, resolve=True) or None,  # type: ignore[arg-type]
        ddp=OmegaConf.to_container(t.ddp, resolve=True) or None,  # type: ignore[arg-type]
        child_command=job_command if HydraConfig.initialized() else None,
    )


def _finish(cfg: DictConfig, spec: RunSpec, model_cfg: Any, data: dict[str, Any], trainer: Any,
            module: Any, tracker: Any, out_dir: Path, val_steps: list[int], fit_seconds: float,
            t_start: float, resumed_from: Optional[Path]) -> dict[str, Any]:  # noqa: UP045
    """Final validation (if the last step had none), metrics, sample, checkpoint, summary."""
    from scalelab.cli.modules import final_sample, throughput_summary

    step = int(trainer.global_step)
    fast = bool(cfg.trainer.fast_dev_run)
    if not fast and (not val_steps or val_steps[-1] != step):
        trainer.validate(module, datamodule=data["datamodule"], verbose=False)
        _stop_if_signalled(cfg, trainer, out_dir)
    cm = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    val_loss = cm.get("val/loss")
    last_ckpt = out_dir / "checkpoints" / "last.ckpt"
    if cfg.callbacks.checkpoint.enabled and not fast:
        trainer.save_checkpoint(last_ckpt)  # the final state, whatever the val schedule was

    tokens = step * spec.batch.tokens_per_step
    perf = throughput_summary(trainer.callbacks)
    if perf.get("perf/tokens_per_sec"):  # measured windows: no startup, no validation time
        tok_s, mfu = perf["perf/tokens_per_sec"], perf.get("perf/mfu")
    else:  # whole fit() wall time
        steps_this_session = step - int(module_start_step(resumed_from))
        tok_s = steps_this_session * spec.batch.tokens_per_step / max(fit_seconds, 1e-9)
        fpt = model_cfg.flops_per_token(training=True, attention=True, seq_len=spec.block_size)
        mfu = _mfu(cfg, tok_s * fpt / spec.world_size)
    sample = final_sample(cfg, spec, module, data) if trainer.is_global_zero else ""

    final = {
        "final/val_loss": val_loss,
        "final/val_bpb": cm.get("val/bpb"),
        "final/val_ppl": math.exp(val_loss) if val_loss is not None and val_loss < 50 else None,
        "final/train_loss": cm.get("train/loss"),
        "final/tokens_seen": tokens,
        "final/steps": step,
        "final/tokens_per_s": tok_s,
        "final/mfu": mfu,
        "final/fit_seconds": fit_seconds,
        "final/time_to_first_step": perf.get("perf/time_to_first_step"),
    }
    for k, v in cm.items():  # e.g. val/exact_match from the seq2seq module (not val/loss again)
        if k.startswith("val/") and f"final/{k[4:]}" not in final and f"final/val_{k[4:]}" not in final:
            final[f"final/{k[4:]}"] = v
    from scalelab.cli.final import record_final

    record_final(tracker, final)  # tags + a table artifact, not one-point metric charts
    if sample:
        atomic_write_text(out_dir / "sample.txt", sample)
        tracker.log_text(sample, "sample.txt")
    if cfg.logger.log_checkpoint and last_ckpt.is_file() and trainer.is_global_zero:
        tracker.log_artifact(last_ckpt, "checkpoints")
    return {
        "run_id": tracker.run_id,
        "experiment_id": tracker.experiment_id,
        "tracking_uri": tracker.tracking_uri,
        "experiment_name": str(cfg.logger.experiment_name) if tracker.run_id else None,
        "run_name": str(cfg.run_name),
        "output_dir": str(out_dir),
        "final_val_loss": val_loss,
        "metrics": final,
        "sample": sample,
        "wall_seconds": time.time() - t_start,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "world_size": spec.world_size,
    }


def module_start_step(ckpt: Optional[Path]) -> int:  # noqa: UP045
    """Global step stored in a checkpoint (0 for a fresh run)."""
    if ckpt is None:
        return 0
    import torch

    try:
        return int(torch.load(ckpt, map_location="cpu", weights_only=True).get("global_step", 0))
    except Exception:  # unreadable: throughput just covers the whole run
        return 0


def _mfu(cfg: DictConfig, flops_per_s_per_device: float) -> Optional[float]:  # noqa: UP045
    try:
        from scalelab.training.perf import peak_flops

        accel = str(cfg.trainer.accelerator)
        import torch

        device = "cuda" if accel in ("gpu", "cuda", "auto") and torch.cuda.is_available() else "cpu"
        return flops_per_s_per_device / peak_flops(device, str(cfg.trainer.precision))
    except Exception:  # MFU is informative only
        return None


def _print_summary(cfg: DictConfig, s: dict[str, Any]) -> None:
    m = s["metrics"]
    line = "─" * 72
    out = [line, "scalelab-train finished", line]
    if s["run_id"]:
        out.append(f"MLflow run    : {s['run_id']}  (experiment {s['experiment_name']!r})")
        out.append(f"tracking URI  : {s['tracking_uri']}")
    out.append(f"output folder : {s['output_dir']}")
    vl = s["final_val_loss"]
    if vl is not None:
        bpb = m.get("final/val_bpb")
        out.append(f"final val loss: {vl:.4f}" + (f"  ({bpb:.3f} bits/byte)" if bpb else ""))
    for k, v in m.items():
        if k.startswith("final/") and "exact" in k and v is not None:
            out.append(f"{k[6:]:<14}: {v:.4f}")
    mfu = m.get("final/mfu")
    out.append(
        f"trained       : {m['final/steps']} steps, {m['final/tokens_seen']:,} tokens in "
        f"{m['final/fit_seconds']:.0f} s ({m['final/tokens_per_s']:,.0f} tokens/s"
        + (f", MFU {100 * mfu:.1f}%" if mfu else "") + f"); wall {s['wall_seconds']:.0f} s"
    )
    if s["sample"]:
        out += ["sample:", s["sample"].rstrip(), line]
    if s["run_id"]:
        ui = "make ui" if str(s["tracking_uri"]).startswith("sqlite") else s["tracking_uri"]
        out.append(f"compare runs in the MLflow UI: {ui}  (python -m scalelab.tracking.ui)")
    log.info("\n".join(out))  # console and train.log (Hydra job logging)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
