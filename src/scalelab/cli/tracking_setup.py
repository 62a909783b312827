"""The run's MLflow side before training: probe the server, start or reopen the run, log its
params and config (all MLflow code itself is in scalelab.tracking)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from scalelab.config.spec import RunSpec
from scalelab.data.bundle import DataBundle
from scalelab.model import ModelConfig
from scalelab.tracking.redact import redact


def tracking_uri(spec: RunSpec, rank0: bool) -> str | None:
    """The run's MLflow store; None when nothing is tracked (``logger=none``, ranks > 0, a
    fast_dev_run). No mlflow import: config errors found later stay fast."""
    if spec.logger.backend != "mlflow" or not rank0 or spec.fast_dev_run:
        return None
    from scalelab.tracking.store import remote_env_defaults, resolve_tracking_uri

    remote_env_defaults()  # before MLflow's HTTP client reads them
    return resolve_tracking_uri(spec.logger.tracking_uri, Path(spec.paths.root))


def probe_tracking(spec: RunSpec, uri: str | None) -> None:
    """A dead tracking server, or a broken or read-only local store, fails here, before any
    data is prepared."""
    if uri is None:
        return
    from scalelab.tracking.store import probe
    from scalelab.tracking.store_check import check_sqlite_store, sqlite_path

    probe(uri, timeout=float(spec.logger.probe_timeout))
    check_sqlite_store(uri)
    db = sqlite_path(uri)
    if db is not None and db.exists():  # deeper damage shows as MLflow opens it: now, not later
        from scalelab.tracking.run import client_for

        client_for(uri)  # kept open for the run (one client per store and process)


def record_refused_multirun_job(cfg: DictConfig) -> bool:
    """A ``--multirun`` job refused before it had an MLflow run still marks the multirun's
    parent FAILED (best effort: a store that is itself the problem is left alone). True if the
    parent now says FAILED."""
    import contextlib

    logger = cfg.get("logger") or {}
    if logger.get("backend") != "mlflow" or logger.get("parent_run_id"):
        return False  # not tracked, or a scaling sweep's point (the sweep reports it)
    from scalelab.tracking.multirun import record_refused_job
    from scalelab.tracking.store import resolve_tracking_uri
    from scalelab.tracking.store_check import check_sqlite_store

    with contextlib.suppress(Exception):
        uri = resolve_tracking_uri(logger.get("tracking_uri"), Path(str(cfg.paths.root)))
        check_sqlite_store(uri)
        record_refused_job(uri, str(logger.get("experiment_name")),
                           Path(HydraConfig.get().sweep.dir), f"{cfg.run_name} (multirun)",
                           logger.get("artifact_root"))
        return True
    return False


def start_tracker(spec: RunSpec, uri: str | None, resume_run_id: str | None,
                  base_name: str) -> Any:
    """A tracker on a new or reopened MLflow run named ``spec.run_name`` (the run's one name)
    in the store ``uri`` (mlflow is imported here); a NullTracker when nothing is tracked.
    ``base_name``: the experiment's run_name (a multirun's parent is named after it)."""
    from scalelab.tracking.null import NullTracker

    if uri is None:
        return NullTracker()
    from scalelab.cli import naming
    from scalelab.tracking.meta import run_tags
    from scalelab.tracking.run import Tracker

    tags = run_tags(Path(spec.paths.root))
    tags.update({
        "scalelab.objective": spec.objective,
        "scalelab.output_dir": str(spec.paths.output_dir),
        "scalelab.data": spec.data.name,
        "scalelab.tokenizer": spec.tokenizer.name,
    })
    tags.update({str(k): str(v) for k, v in spec.tags.items()})
    multirun_parent = None if resume_run_id else naming.multirun_parent(spec, uri, base_name)
    logger = spec.logger
    tracker = Tracker.start(
        tracking_uri=uri, experiment_name=str(logger.experiment_name),
        run_name=spec.run_name, tags=tags, artifact_root=logger.artifact_root,
        parent_run_id=logger.parent_run_id or multirun_parent, resume_run_id=resume_run_id,
        probe_timeout=float(logger.probe_timeout), folder=Path(str(spec.paths.output_dir)),
        outage_wait_s=float(logger.outage_wait_s),
        metrics_interval_s=float(logger.metrics_interval_s),
    )
    if multirun_parent:
        tracker.multirun_parent_id = multirun_parent
        tracker.multirun_dir = Path(HydraConfig.get().sweep.dir)
    if tracker.run_name:  # a repeat is NAME #2 in MLflow (tracking/run_names.py): say it everywhere
        spec.run_name = tracker.run_name
    return tracker


def run_params(cfg: DictConfig, spec: RunSpec, model_cfg: ModelConfig,
               data: DataBundle) -> dict[str, Any]:
    """The MLflow params of a run (scalelab.tracking.params owns the names)."""
    import torch

    from scalelab.tracking.params import run_params as tracked_params

    optim, batch = spec.optim, spec.batch
    return tracked_params(
        model_cfg, objective=spec.objective, seq_len=spec.block_size, max_steps=spec.max_steps,
        tokens_per_step=batch.tokens_per_step, global_batch_sequences=batch.global_batch_sequences,
        micro_batch=batch.micro_batch, grad_accum=batch.grad_accum, world_size=spec.world_size,
        strategy=str(spec.trainer.strategy), precision=str(spec.trainer.precision), lr=optim.lr,
        tokenizer=spec.tokenizer.name if spec.objective != "seq2seq" else "seq2seq_char",
        dataset=spec.data.name, seed=spec.seed,
        extra={
            "max_seq_len": model_cfg.max_seq_len,
            "weight_decay": optim.weight_decay, "beta1": optim.beta1, "beta2": optim.beta2,
            "schedule": optim.schedule, "warmup": optim.resolve_warmup(spec.max_steps),
            "min_lr_ratio": optim.min_lr_ratio, "grad_clip": optim.grad_clip,
            "batch_unit": str(spec.train.batch_unit), "run_name": spec.run_name,
            "compile": bool(spec.train.compile),
            "data_task": spec.data.task if spec.objective == "seq2seq" else None,
            "config_hash": config_hash(cfg),
            "torch_threads": torch.get_num_threads(),
            "init_from": spec.init_from,  # model.init_from=hf:PATH, the weights it started from
        },
    )


def config_hash(cfg: DictConfig) -> str:
    """Hash of the resolved config minus where/how it runs: equal hash = same experiment."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    for key in ("paths", "logger", "resume", "ckpt_path", "tags"):
        resolved.pop(key, None)
    resolved.get("trainer", {}).pop("enable_progress_bar", None)
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()[:16]


def log_config(tracker: Any, cfg: DictConfig) -> None:
    """The composed config and the command's overrides, as run artifacts."""
    tracker.log_text(redact(OmegaConf.to_yaml(cfg, resolve=True)), "config/config.yaml")
    overrides: list[str] = []
    if HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    tracker.log_text(redact("\n".join(overrides)) + "\n", "config/overrides.txt")
