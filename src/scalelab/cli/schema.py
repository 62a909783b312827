"""Structured-config schemas: the typed shape of `conf/train.yaml`, registered in Hydra's ConfigStore.

`conf/train.yaml` lists ``train_schema`` first in its defaults, so every yaml and every
command-line override is merged INTO these dataclasses: a mistyped key
(``model.d_modle=128``) or a wrong type (``model.d_model=abc``) fails at composition, naming
the key, before anything runs. The component dataclasses (ModelConfig, DataConfig,
TokenizerConfig, OptimConfig) come from their packages; the rest are defined here.

Also registers the OmegaConf resolvers the configs use:
``${scalelab.root:}`` (project root) and ``${scalelab.run_dir:...}`` (the run folder).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional  # noqa: UP035  (OmegaConf needs typing generics)

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from scalelab.data.config import DataConfig, TokenizerConfig
from scalelab.model import ModelConfig
from scalelab.tracking.root import repo_root
from scalelab.training.config import OptimConfig


@dataclass
class TrainSection:
    """Run length, batch and step settings (``train.*``)."""

    # counts typed Any so that 5e6 is accepted; cli/counts.py turns them into whole numbers
    max_steps: Any = None  # optimizer steps; wins over max_tokens
    max_tokens: Any = None  # token budget -> steps
    global_batch_size: int = 32
    batch_unit: str = "sequences"  # sequences | tokens
    micro_batch_size: Optional[int] = None  # noqa: UP045
    block_size: int = 256
    val_every: int = 100  # optimizer steps between validations
    val_batches: int = 20  # micro-batches per validation
    compile: bool = False
    activation_checkpointing: bool = False  # recompute block activations in backward (less memory)
    matmul_precision: str = "high"  # highest | high | medium
    num_threads: Optional[int] = None  # noqa: UP045
    # WSD branches (sweep.wsd): save full-state checkpoints/step_<N>.ckpt at these optimizer steps
    save_at_steps: List[int] = field(default_factory=list)  # noqa: UP006
    # start a NEW run (new folder, new MLflow run) from this checkpoint: weights, optimizer,
    # data position and step counter carry over; the lr schedule is rebuilt from this config
    init_from: Optional[str] = None  # noqa: UP045


@dataclass
class ModelSection(ModelConfig):
    """``model.*``: the ModelConfig fields plus where its starting weights come from."""

    # hf:PATH: a local Hugging Face folder (GPT-2, Llama, BERT); its config.json sets the shape
    init_from: Optional[str] = None  # noqa: UP045


@dataclass
class TrainerSchema:
    """Lightning Trainer arguments (``trainer.*``); strategy presets come from conf/trainer/."""

    accelerator: str = "cpu"
    devices: Any = 1  # int, "auto" or a list of ids
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_steps: Any = None  # overrides train.max_steps/max_tokens when set (a count: 2e3 is fine)
    log_every_n_steps: int = 10
    enable_progress_bar: bool = True
    deterministic: Any = False
    num_sanity_val_steps: int = 0
    fast_dev_run: Any = False  # bool or number of batches
    overfit_batches: Any = 0.0  # int = batches, float = fraction (Lightning's meaning)
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    profiler: Optional[str] = None  # noqa: UP045
    detect_anomaly: bool = False
    benchmark: Optional[bool] = None  # noqa: UP045
    # strategy options (scalelab.training.distributed.build_strategy): trainer=ddp / trainer=fsdp
    ddp: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    fsdp: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006


@dataclass
class LoggerSchema:
    """Where the run is tracked (``logger.*``; backend mlflow | none)."""

    backend: str = "mlflow"
    tracking_uri: Optional[str] = None  # noqa: UP045
    artifact_root: Optional[str] = None  # noqa: UP045
    experiment_name: str = "scalelab"
    parent_run_id: Optional[str] = None  # noqa: UP045
    system_metrics: bool = False
    system_metrics_interval: float = 10.0
    log_checkpoint: bool = True
    probe_timeout: float = 3.0
    outage_wait_s: float = 120.0  # at the end, wait this long for a tracking server that went away


@dataclass
class CheckpointSchema:
    enabled: bool = True
    save_last: bool = True
    save_best: bool = True
    monitor: str = "val/loss"
    every_n_steps: Optional[int] = None  # noqa: UP045


@dataclass
class SampleSchema:
    enabled: bool = True
    prompt: str = "\n"
    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: Optional[int] = 200  # noqa: UP045


@dataclass
class ThroughputSchema:
    enabled: bool = True
    window: int = 20


@dataclass
class ProgressBarSchema:
    refresh_rate: int = 10
    plain_every: int = 50  # optimizer steps between plain lines when stdout is not a TTY


@dataclass
class CallbacksSchema:
    checkpoint: CheckpointSchema = field(default_factory=CheckpointSchema)
    sample: SampleSchema = field(default_factory=SampleSchema)
    throughput: ThroughputSchema = field(default_factory=ThroughputSchema)
    progress_bar: ProgressBarSchema = field(default_factory=ProgressBarSchema)


@dataclass
class PathsSchema:
    root: str = MISSING
    data_dir: str = MISSING
    log_dir: str = MISSING
    output_dir: Optional[str] = None  # noqa: UP045


@dataclass
class TrainSchema:
    """The whole `scalelab-train` config."""

    model: ModelSection = MISSING
    data: DataConfig = MISSING
    tokenizer: TokenizerConfig = MISSING
    optim: OptimConfig = MISSING
    trainer: TrainerSchema = MISSING
    logger: LoggerSchema = MISSING
    callbacks: CallbacksSchema = MISSING
    paths: PathsSchema = MISSING
    train: TrainSection = field(default_factory=TrainSection)
    seed: int = 1337
    objective: Optional[str] = None  # noqa: UP045
    run_name: str = "train"
    tags: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    resume: bool = False
    ckpt_path: Optional[str] = None  # noqa: UP045


# --- resolvers --------------------------------------------------------------------------------
_RUN_DIRS: dict[tuple, str] = {}  # one answer per process, however often Hydra re-resolves


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def latest_run_dir(log_dir: Path, run_name: str) -> Optional[Path]:  # noqa: UP045
    """The newest ``<log_dir>/<date>/<time>_<run_name>[_N]`` holding checkpoints/last.ckpt."""
    found = []
    for ckpt in log_dir.glob("*/*/checkpoints/last.ckpt"):
        folder = ckpt.parent.parent
        stem = folder.name.split("_", 1)[-1] if "_" in folder.name else ""
        if stem == run_name or (stem.rsplit("_", 1)[0] == run_name and stem.rsplit("_", 1)[-1].isdigit()):
            found.append((ckpt.stat().st_mtime, folder))
    return max(found)[1] if found else None


def resolve_run_dir(output_dir: Any, resume: Any, log_dir: str, run_name: str, day: str,
                    clock: str, ckpt_path: Any = None) -> str:
    """The run folder (see conf/hydra/default.yaml). Pure function of its arguments + disk."""
    key = (output_dir, resume, log_dir, run_name, day, clock, ckpt_path)
    if key in _RUN_DIRS:
        return _RUN_DIRS[key]
    if output_dir:
        out = Path(str(output_dir)).expanduser().resolve()
    elif ckpt_path and Path(str(ckpt_path)).parent.name == "checkpoints":
        out = Path(str(ckpt_path)).expanduser().resolve().parent.parent  # continue that run
    elif _truthy(resume):
        latest = latest_run_dir(Path(log_dir), run_name)
        if latest is None:
            raise ValueError(
                f"resume=true: no earlier run named {run_name!r} with checkpoints/last.ckpt under "
                f"{log_dir}; pass paths.output_dir=<run folder> (or ckpt_path=<file>), or "
                f"run_name=<the run's name>"
            )
        out = latest
    else:
        out = Path(log_dir) / day / f"{clock}_{run_name}"
        n = 1
        while out.exists():  # two runs started in the same second
            out = Path(log_dir) / day / f"{clock}_{run_name}_{n}"
            n += 1
    _RUN_DIRS[key] = str(out)
    return str(out)


def register() -> None:
    """Register resolvers and schemas (idempotent; runs on import)."""
    if not OmegaConf.has_resolver("scalelab.root"):
        OmegaConf.register_new_resolver("scalelab.root", lambda: str(repo_root()))
    from scalelab.cli.run_folder import hydra_subdir, run_dir_resolver

    if not OmegaConf.has_resolver("scalelab.run_dir"):
        OmegaConf.register_new_resolver("scalelab.run_dir", run_dir_resolver)
    if not OmegaConf.has_resolver("scalelab.hydra_subdir"):
        OmegaConf.register_new_resolver("scalelab.hydra_subdir", hydra_subdir)
    ConfigStore.instance().store(name="train_schema", node=_train_schema_node())


def _train_schema_node() -> Any:
    """TrainSchema with ``callbacks`` open to new keys, so a preset (``callbacks/early_stopping.yaml``)
    can add ``<name>: {_target_: ...}`` entries; the platform's typed keys stay validated."""
    node = OmegaConf.structured(TrainSchema)
    node.callbacks = OmegaConf.structured(CallbacksSchema)
    OmegaConf.set_struct(node.callbacks, False)
    return node


register()
