"""`scalelab-train`: train one transformer, checkpoint it, and track it in MLflow.

    scalelab-train                                   # the default experiment (pystdlib_small)
    scalelab-train +experiment=shakespeare_char data.path=/path/tinyshakespeare.txt
    scalelab-train model=llama_tiny model.n_layers=6 optim.lr=3e-4 trainer.max_steps=500
    scalelab-train --cfg job                         # print the composed config
    scalelab-train resume=true run_name=NAME         # continue the latest run named NAME

Order of work: validate the config (no IO) -> check the keys torch and Lightning own -> probe
the tracking server -> prepare data -> create/reopen the MLflow run (MLflow loads here) -> fit
-> final validation, sample, artifacts, summary.

Imports stay light up to the run itself: `--help`, composition and config errors never load
Lightning or MLflow (each helper imports them where it needs them).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from scalelab.cli import hydra_ddp, trainer_args
from scalelab.cli.resume import (
    ResumePoint,
    check_branch_keys,
    check_not_finished,
    check_resume_point,
    check_same_config,
    resume_point,
)
from scalelab.cli.run_folder import RunFolder
from scalelab.config.compose import normalize_overrides
from scalelab.config.schema import register
from scalelab.config.spec import RunSpec, build_spec
from scalelab.config.user_conf import check_user_config_folders
from scalelab.data.bundle import DataBundle
from scalelab.model import ModelConfig
from scalelab.tracking import is_global_zero
from scalelab.tracking.store import TrackingServerUnreachable

# Before @hydra.main composes: Hydra's launchers (joblib) also import this module in their
# worker processes to unpickle the task, and compose there.
register()

__all__ = ["main", "normalize_overrides", "train"]


def main() -> None:
    """Console entry point (`scalelab-train`); the console script does sys.exit(main())."""
    args = ["hydra.verbose=true" if a in ("-v", "--verbose") else a for a in sys.argv[1:]]
    sys.argv = [sys.argv[0], *normalize_overrides(args)]
    try:
        check_user_config_folders(sys.argv[1:])  # a YAML error: one line, not Hydra's traceback
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.argv = hydra_ddp.torchrun_argv(sys.argv)  # scale-out: torchrun ranks > 0 use rank 0's folder
    _hydra_main()


@hydra.main(version_base="1.3", config_path="pkg://scalelab.conf", config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    """Hydra task; returns the final val loss (what a Hydra sweeper would minimize)."""
    hydra_ddp.begin_job(cfg)  # scale-out: torchrun layout, one GPU per joblib job
    try:
        summary = train(cfg)
    except (ValueError, OSError, TrackingServerUnreachable) as e:
        # Config and input errors: one clear line instead of a traceback (in a --multirun the
        # launcher records the job FAILED, goes on with the other points, then prints the line).
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.RUN:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        from scalelab.cli.job_failure import job_failed
        from scalelab.cli.tracking_setup import record_refused_multirun_job

        parent_failed = is_global_zero() and record_refused_multirun_job(cfg)
        raise job_failed(cfg, e, parent_failed) from None  # cli/job_failure.py
    except (MemoryError, RuntimeError) as e:
        # out of memory (host or GPU): the run is recorded FAILED; the user gets one line
        if not _out_of_memory(e) or not HydraConfig.initialized() \
                or HydraConfig.get().mode != RunMode.RUN:
            raise
        print(f"error: out of memory ({_first_line(e)}): the model or batch does not fit; lower "
              "train.micro_batch_size (gradient accumulation keeps the batch), the model size or "
              "train.block_size, or set train.activation_checkpointing=true", file=sys.stderr)
        sys.exit(2)
    finally:
        hydra_ddp.end_job()  # scale-out: join this job's ranks, reset the env for the next job
    return summary.get("final_val_loss")


def _out_of_memory(e: BaseException) -> bool:
    """MemoryError, torch.OutOfMemoryError (GPU), or the CPU allocator's RuntimeError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" \
        or "can't allocate memory" in str(e) or "out of memory" in str(e).lower()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0][:160] if text else type(e).__name__)


# --- the run ------------------------------------------------------------------------------
@dataclass
class CheckedRun:
    """A run whose every input passed its checks; nothing is written or created yet."""

    cfg: DictConfig  # the composed config: logged, hashed, and its +trainer/+callbacks extras
    spec: RunSpec
    model_cfg: ModelConfig  # with the tokenizer's vocabulary
    data: DataBundle
    point: ResumePoint  # the checkpoint to continue from (ckpt None: a fresh run)
    tracking_uri: str | None  # the MLflow store (None: nothing is tracked)
    folder: RunFolder

    @property
    def out_dir(self) -> Path:
        return self.folder.out_dir

    @property
    def lr_segments(self) -> list[tuple[int, int]]:
        return self.point.lr_segments or [(0, self.spec.max_steps)]


def train(cfg: DictConfig) -> dict[str, Any]:
    """Run one training job from a composed config; returns the summary dict."""
    from scalelab.cli.tracking_setup import tracking_uri

    t_start = time.time()
    rank0 = is_global_zero()
    requested = _as_requested(cfg)  # before any key is filled in: what resume compares
    folder = RunFolder(_output_dir(cfg))
    with contextlib.ExitStack() as held:
        with folder.abandoned_on_error(rank0):
            spec = _built_spec(cfg, folder)  # config errors: before torch is even imported
            held.enter_context(folder.held(rank0))  # one writer per run folder, till the end
        with folder.abandoned_on_error(rank0):
            _check_runtime_keys(cfg, spec)
        from scalelab.training.signals import STOP

        STOP.install()  # SIGTERM/SIGINT/SIGUSR1: stop at a step boundary, checkpoint, KILLED
        try:
            return _train(cfg, spec, folder, rank0, t_start, tracking_uri(spec, rank0), requested)
        finally:
            STOP.uninstall()


def _as_requested(cfg: DictConfig) -> dict[str, Any]:
    from omegaconf import OmegaConf

    tree = OmegaConf.to_container(cfg, resolve=False)
    return tree if isinstance(tree, dict) else {}


def _train(cfg: DictConfig, spec: RunSpec, folder: RunFolder, rank0: bool, t_start: float,
           uri: str | None, requested: dict[str, Any]) -> dict[str, Any]:
    with folder.abandoned_on_error(rank0):  # nothing is written before the inputs are checked
        run = _check_run(cfg, spec, folder, rank0, uri, requested)
    if rank0:
        folder.out_dir.mkdir(parents=True, exist_ok=True)
        folder.commit()

    from scalelab.cli.tracking_setup import start_tracker

    tracker = start_tracker(run.spec, run.tracking_uri, run.point.run_id, str(cfg.run_name))
    if rank0:
        from scalelab.cli.banner import print_start

        print_start(run.spec.run_name, run.out_dir, tracker,
                    run.model_cfg, run.spec, run.data, run.point.ckpt, run.lr_segments)
    try:
        if rank0:
            folder.write_run_id(tracker.run_id)
        summary = _tracked_run(run, tracker, t_start)
    except BaseException as e:
        _record_failure(run, tracker, e, rank0)
        raise
    from scalelab.training.signals import STOP, at_phase

    at_phase("exit")
    if rank0:
        from scalelab.cli.outputs import print_summary

        print_summary(summary)
    late = STOP.deferred_signal()
    if late and rank0:  # it came after the outcome was decided: FINISHED, everywhere, exit 0
        print(f"{late} came while the run's FINISHED status was being recorded: it is FINISHED "
              "in summary.json and MLflow; exiting 0", flush=True)
    return summary


def _built_spec(cfg: DictConfig, folder: RunFolder) -> RunSpec:
    """Every config error that needs no torch, before any IO. ``spec.run_name`` is the run's
    one name (its folder's, its MLflow run's: cli/naming.py)."""
    from scalelab.cli import naming

    RunFolder.check_usable(folder.out_dir)
    spec = build_spec(cfg)
    check_branch_keys(spec)
    spec.run_name, name_tags = naming.resolve(spec)
    spec.tags = {**name_tags, **spec.tags}
    return spec


def _check_runtime_keys(cfg: DictConfig, spec: RunSpec) -> None:
    """The keys that torch and Lightning check: precision, +trainer.<any Lightning arg>,
    +callbacks.<name>={_target_: ...}."""
    from scalelab.cli.torch_setup import check_precision

    check_precision(spec)
    cfg.trainer.precision = spec.trainer.precision  # "auto" is saved and logged as what runs
    trainer_args.check(cfg)


def _check_run(cfg: DictConfig, spec: RunSpec, folder: RunFolder, rank0: bool,
               uri: str | None, requested: dict[str, Any]) -> CheckedRun:
    """Choose the checkpoint, probe MLflow and prepare the data: every input error surfaces
    here, before the run folder is committed or an MLflow run exists."""
    from scalelab.cli.torch_setup import seed_everything, setup_torch
    from scalelab.cli.tracking_setup import probe_tracking
    from scalelab.training.signals import is_slurm_requeue

    out_dir = folder.out_dir
    # the saved config names the folder actually used
    cfg.paths.output_dir = spec.paths.output_dir = str(out_dir)
    if is_slurm_requeue() and not spec.ckpt_path and folder.last_checkpoint.exists():
        cfg.resume = spec.resume = True  # SLURM started this job again after a requeue: continue it
    point = resume_point(spec, out_dir)
    check_same_config(point, spec, out_dir, requested)  # before the data: nothing to prepare
    check_not_finished(point, spec, out_dir)
    probe_tracking(spec, uri)  # dead server: fail now, before the data
    setup_torch(spec)
    data = _prepare_data(spec, rank0)
    model_cfg = spec.with_vocab(data.vocab_size)
    check_resume_point(point, spec, model_config=model_cfg.to_dict(),
                       tokenizer=data.tokenizer_spec)
    _build_datamodule(spec, data)
    seed_everything(spec)  # every input checked: the weights are drawn after this
    return CheckedRun(cfg, spec, model_cfg, data, point, uri, folder)


_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
               errno.EEXIST)


def _prepare_data(spec: RunSpec, rank0: bool) -> DataBundle:
    """The data bundle for the run (token shards prepared or reused); an unwritable cache
    names the key that moves it."""
    from scalelab.cli.banner import stdout_to_log
    from scalelab.data.bundle import build_data_bundle

    try:
        with stdout_to_log():  # the data-preparation messages also reach train.log
            data = build_data_bundle(
                spec.objective, spec.data, spec.tokenizer, micro_batch=spec.batch.micro_batch,
                block_size=spec.block_size, seed=spec.seed, val_batches=int(spec.train.val_batches),
                cache_dir=Path(spec.paths.data_dir), progress=rank0)
    except OSError as e:
        if e.errno not in _UNWRITABLE:
            raise
        raise ValueError(f"paths.data_dir={spec.paths.data_dir}: cannot write the token cache "
                         f"({e.strerror}: {e.filename}); set paths.data_dir to a writable folder "
                         "with free space") from e
    return data


def _build_datamodule(spec: RunSpec, data: DataBundle) -> None:
    """The run's DataModule, once every input is checked (building it imports Lightning), and
    before anything is written."""
    datamodule = data.datamodule
    overfit = spec.trainer.overfit_batches
    if isinstance(overfit, int) and overfit > 0:
        datamodule.pin_batches(overfit)  # really the same batches every step


def _tracked_run(run: CheckedRun, tracker: Any, t_start: float) -> dict[str, Any]:
    """Params, config, fit and final values, inside the tracker's status guard."""
    from scalelab.cli.lightning_module import build_module
    from scalelab.cli.tracking_setup import log_config, run_params
    from scalelab.cli.trainer_build import build_trainer

    spec = run.spec
    with tracker.status_guard():
        if not tracker.resumed:
            tracker.log_params(run_params(run.cfg, spec, run.model_cfg, run.data))
        log_config(tracker, run.cfg)
        if spec.logger.system_metrics:
            tracker.start_system_metrics(float(spec.logger.system_metrics_interval))
        module = build_module(spec, run.model_cfg, run.data, run.lr_segments)
        val_steps: list[int] = []
        trainer = build_trainer(run.cfg, spec, tracker, run.out_dir, _checkpoint_meta(run, tracker),
                                val_steps)
        t_fit = time.time()
        ckpt = run.point.ckpt
        trainer.fit(module, datamodule=run.data.datamodule, ckpt_path=str(ckpt) if ckpt else None)
        fit_seconds = time.time() - t_fit
        _stop_if_signalled(spec, trainer, run.out_dir)
        if trainer.interrupted:
            raise KeyboardInterrupt  # Lightning swallowed Ctrl-C: record the run as KILLED
        summary = _final_values_and_outputs(run, trainer, module, tracker, val_steps,
                                            fit_seconds, t_start)
        _commit_finished(run, summary)
    # (the guard closed the MLflow run FINISHED, with any signal still deferred)
    return summary


def _commit_finished(run: CheckedRun, summary: dict[str, Any]) -> None:
    """The outcome is decided: from here a signal is deferred until summary.json and MLflow both
    say FINISHED (summary.json first; the status guard closes the MLflow run right after)."""
    from scalelab.training.signals import STOP, at_phase

    at_phase("summary")
    STOP.defer()
    summary["status"] = "FINISHED"
    if is_global_zero():
        run.folder.write_summary(summary)
    at_phase("mlflow_end")


def _checkpoint_meta(run: CheckedRun, tracker: Any) -> dict[str, Any]:
    """What every checkpoint of the run records about it (RunRecorder; resume checks it)."""
    return {
        "model_config": run.model_cfg.to_dict(),
        "objective": run.spec.objective,
        "tokenizer": run.data.tokenizer_spec,
        "block_size": run.spec.block_size,
        "data": run.spec.data.name,
        "mlflow_run_id": tracker.run_id,
        "run_name": run.spec.run_name,
        "lr_segments": [list(s) for s in run.lr_segments],
    }


def _final_values_and_outputs(run: CheckedRun, trainer: Any, module: Any, tracker: Any,
                              val_steps: list[int], fit_seconds: float,
                              t_start: float) -> dict[str, Any]:
    """Final validation (if the last step had none) and checkpoint; then compute the final
    values, write them out, and return the summary."""
    from scalelab.cli.final import final_metrics
    from scalelab.cli.lightning_module import final_sample
    from scalelab.cli.outputs import run_summary, write_outputs
    from scalelab.training.signals import at_phase

    spec, out_dir = run.spec, run.out_dir
    step = int(trainer.global_step)
    at_phase("final_validation")
    if not spec.fast_dev_run and (not val_steps or val_steps[-1] != step):
        trainer.validate(module, datamodule=run.data.datamodule, verbose=False)
        _stop_if_signalled(spec, trainer, out_dir)
    at_phase("final_checkpoint")
    if spec.saves_checkpoints:
        trainer.save_checkpoint(run.folder.last_checkpoint)  # the final state, any val schedule
    final = final_metrics(trainer, spec, run.model_cfg, fit_seconds, run.point.ckpt)
    at_phase("final_sample")
    sample = final_sample(spec, module, run.data) if trainer.is_global_zero else ""
    at_phase("upload")
    write_outputs(tracker, spec, out_dir, final, sample, run.folder.last_checkpoint,
                  trainer.is_global_zero)
    return run_summary(tracker, spec, out_dir, final, sample, t_start, run.point.ckpt)


def _stop_if_signalled(spec: RunSpec, trainer: Any, out_dir: Path) -> None:
    """A signal that came during the last step (or validation) still stops the run, after a
    checkpoint of the state it reached."""
    from scalelab.training.signals import STOP

    if STOP.signum is not None and spec.saves_checkpoints:
        trainer.save_checkpoint(out_dir / "checkpoints" / "last.ckpt")
    STOP.raise_if_stopped()


def _record_failure(run: CheckedRun, tracker: Any, error: BaseException, rank0: bool) -> None:
    """Close the MLflow run as FAILED or KILLED and leave summary.json; a signal exits 128+N."""
    from scalelab.cli.stopping import on_stop
    from scalelab.training.signals import STOP

    STOP.defer()  # a second signal must not cut the KILLED/FAILED record in half
    status = "KILLED" if isinstance(error, (KeyboardInterrupt, SystemExit)) else "FAILED"
    tracker.end(status)  # no-op if the status guard closed it; covers errors before it
    stop = on_stop(run.spec, run.out_dir, tracker, error, rank0)
    if rank0:  # sweeps read the folder's outcome without MLflow
        run.folder.write_failure(status, tracker.run_id, error, stop[0] if stop else None)
    if stop is not None:
        raise stop[1] from None  # exit code 128 + signal (143 for SIGTERM, 130 for Ctrl-C)


def _output_dir(cfg: DictConfig) -> Path:
    if cfg.paths.output_dir:
        return Path(cfg.paths.output_dir).expanduser().resolve()
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir).resolve()
    raise ValueError("paths.output_dir is not set (needed when not running under Hydra)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
