"""Structured-config schemas: the typed shape of `conf/train.yaml`, registered in Hydra's ConfigStore.

`conf/train.yaml` lists ``train_schema`` first in its defaults, so every yaml and every
command-line override is merged INTO these dataclasses: a mistyped key
(``model.d_modle=128``) or a wrong type (``model.d_model=abc``) fails at composition, naming
the key, before anything runs. The component dataclasses (ModelConfig, DataConfig,
TokenizerConfig, OptimConfig) come from their packages; the rest are defined here.

One source per value: the YAML files under ``conf/`` hold every value; these dataclasses hold
the types. A key that the YAML always sets is ``MISSING`` here (no second default to drift);
a default is kept only where no YAML sets the key (``trainer.ddp``/``fsdp``, ``model.init_from``).

``register()`` (idempotent) stores the schema and the OmegaConf resolvers the configs use:
``${scalelab.root:}`` (project root), ``${scalelab.run_dir:...}`` and
``${scalelab.hydra_subdir:...}`` (the run folder, config/run_dir.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from scalelab.config.names import folder_stem
from scalelab.config.run_dir import hydra_subdir, run_dir_resolver
from scalelab.config.run_name import run_label_resolver
from scalelab.data.config import DataConfig, TokenizerConfig
from scalelab.model import ModelConfig
from scalelab.paths import repo_root
from scalelab.training.config import OptimConfig


@dataclass
class TrainSection:
    """Run length, batch and step settings (``train.*``; values in conf/train.yaml)."""

    # counts typed Any so that 5e6 is accepted; config/counts.py turns them into whole numbers
    max_steps: Any = MISSING  # optimizer steps; wins over max_tokens
    max_tokens: Any = MISSING  # token budget -> steps
    global_batch_size: int = MISSING
    batch_unit: str = MISSING  # sequences | tokens
    micro_batch_size: int | None = MISSING
    block_size: int = MISSING
    val_every: int = MISSING  # optimizer steps between validations
    val_batches: int = MISSING  # micro-batches per validation
    compile: bool = MISSING
    compile_blocks_once: bool = MISSING  # with compile: trace one block, reuse it for every layer
    activation_checkpointing: bool = MISSING  # recompute block activations in backward
    matmul_precision: str = MISSING  # highest | high | medium
    num_threads: int | None = MISSING  # torch CPU threads; None = cores // scalelab processes sharing them
    # WSD branches (sweep.wsd): save full-state checkpoints/step_<N>.ckpt at these optimizer steps
    save_at_steps: list[int] = MISSING
    # start a NEW run (new folder, new MLflow run) from this checkpoint: weights, optimizer,
    # data position and step counter carry over; the lr schedule is rebuilt from this config
    init_from: str | None = MISSING
    # resume=true with more steps than the lr curve was planned for: continue | restart | replan
    resume_schedule: str | None = MISSING


@dataclass
class ModelSection(ModelConfig):
    """``model.*``: the ModelConfig fields plus where its starting weights come from."""

    # hf:PATH: a local Hugging Face folder (GPT-2, Llama, BERT); its config.json sets the shape
    init_from: str | None = None


@dataclass
class TrainerSchema:
    """Lightning Trainer arguments (``trainer.*``; values in conf/trainer/cpu.yaml and presets)."""

    accelerator: str = MISSING
    devices: Any = MISSING  # int, "auto" or a list of ids
    num_nodes: int = MISSING
    strategy: str = MISSING
    precision: str = MISSING
    max_steps: Any = MISSING  # overrides train.max_steps/max_tokens when set (2e3 is fine)
    log_every_n_steps: int = MISSING
    enable_progress_bar: bool = MISSING
    deterministic: Any = MISSING
    num_sanity_val_steps: int = MISSING
    fast_dev_run: Any = MISSING  # bool or number of batches
    overfit_batches: Any = MISSING  # int = batches, float = fraction (Lightning's meaning)
    limit_train_batches: Any = MISSING
    limit_val_batches: Any = MISSING
    profiler: str | None = MISSING
    detect_anomaly: bool = MISSING
    benchmark: bool | None = MISSING
    # strategy options (scalelab.training.distributed.build_strategy): trainer=ddp / trainer=fsdp
    ddp: dict[str, Any] = field(default_factory=dict)
    fsdp: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerSchema:
    """Where the run is tracked (``logger.*``; conf/logger/mlflow.yaml | none.yaml)."""

    backend: str = MISSING  # mlflow | none
    tracking_uri: str | None = MISSING
    artifact_root: str | None = MISSING
    experiment_name: str = MISSING
    parent_run_id: str | None = MISSING
    system_metrics: bool = MISSING
    system_metrics_interval: float = MISSING
    log_checkpoint: bool = MISSING
    probe_timeout: float = MISSING
    outage_wait_s: float = MISSING  # at the end, wait this long for a server that went away
    metrics_interval_s: float = MISSING  # send metric values at most this often (0: every log step)


@dataclass
class CheckpointSchema:
    enabled: bool = MISSING
    save_last: bool = MISSING
    save_best: bool = MISSING
    monitor: str = MISSING
    every_n_steps: int | None = MISSING


@dataclass
class SampleSchema:
    enabled: bool = MISSING
    prompt: str = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_k: int | None = MISSING


@dataclass
class ThroughputSchema:
    enabled: bool = MISSING
    window: int | None = MISSING


@dataclass
class ProgressBarSchema:
    refresh_rate: int = MISSING
    plain_every: int = MISSING  # optimizer steps between plain lines when stdout is not a TTY


@dataclass
class CallbacksSchema:
    """``callbacks.*``: the platform's callbacks (values in train.yaml's ``callbacks:``); the
    ``callbacks`` group's presets add ``_target_`` entries beside them."""

    checkpoint: CheckpointSchema = MISSING
    sample: SampleSchema = MISSING
    throughput: ThroughputSchema = MISSING
    progress_bar: ProgressBarSchema = MISSING


@dataclass
class PathsSchema:
    root: str = MISSING
    data_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: str | None = MISSING


@dataclass
class TrainSchema:
    """The whole `scalelab-train` config (top-level values in conf/train.yaml)."""

    model: ModelSection = MISSING
    data: DataConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerSchema = MISSING
    logger: LoggerSchema = MISSING
    callbacks: CallbacksSchema = MISSING
    paths: PathsSchema = MISSING
    train: TrainSection = MISSING
    seed: int = MISSING
    objective: str | None = MISSING  # causal | mlm | seq2seq; None = from model.arch
    run_name: str = MISSING
    tags: dict[str, Any] = MISSING
    resume: bool = MISSING
    ckpt_path: str | None = MISSING
    optuna_trial: int | None = MISSING  # set by `-m hparams_search=NAME`: this job's trial


def register() -> None:
    """Store ``train_schema`` and the ``scalelab.*`` resolvers (idempotent: call it before
    composing, as every entry point and config/compose.py do)."""
    resolvers = {"scalelab.root": lambda: str(repo_root()),
                 "scalelab.run_dir": run_dir_resolver,
                 "scalelab.run_label": run_label_resolver,
                 "scalelab.hydra_subdir": hydra_subdir,
                 "scalelab.folder_stem": folder_stem}
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    ConfigStore.instance().store(name="train_schema", node=_train_schema_node())


def _train_schema_node() -> Any:
    """TrainSchema with ``callbacks`` open to new keys, so a preset (``callbacks/early_stopping.yaml``)
    can add ``<name>: {_target_: ...}`` entries; the platform's typed keys stay validated."""
    node = OmegaConf.structured(TrainSchema)
    node.callbacks = OmegaConf.structured(CallbacksSchema)
    OmegaConf.set_struct(node.callbacks, False)
    return node
