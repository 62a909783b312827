"""Turn the composed Hydra config into validated component configs, before any IO.

Everything that can be wrong with a config is found here: the component dataclasses run their
own validation (ModelConfig, DataConfig, TokenizerConfig, OptimConfig), the objective must fit
the architecture, the batch must split over the devices, the run needs a length. No data is
read and no MLflow run exists yet when this raises.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from scalelab.config.counts import as_count
from scalelab.config.names import check_run_name
from scalelab.config.schema import (
    CallbacksSchema,
    LoggerSchema,
    PathsSchema,
    TrainerSchema,
    TrainSection,
)
from scalelab.data.config import DataConfig, TokenizerConfig
from scalelab.model import ModelConfig
from scalelab.model.variants import OBJECTIVE_OF_ARCH
from scalelab.training.batch import BatchPlan, derive_batch, steps_from_budget
from scalelab.training.config import OptimConfig
from scalelab.training.schedules import build_lr_lambda

log = logging.getLogger(__name__)

OBJECTIVE_FOR_ARCH = OBJECTIVE_OF_ARCH  # model/variants.py's ARCHS table owns the pairing
LOGGER_BACKENDS = ("mlflow", "none")
VOCAB_PLACEHOLDER = 256  # validates a model whose vocab_size comes from the tokenizer later


@dataclass
class RunSpec:
    """What one training run is, fully validated and typed (model vocab may still be a
    placeholder): the components, the derived run shape, and the schema sections as dataclasses."""

    model_fields: dict[str, Any]  # ModelConfig fields as configured (vocab_size may be None)
    model: ModelConfig  # validated; vocab_size is a placeholder when model_fields says None
    data: DataConfig
    tokenizer: TokenizerConfig
    optim: OptimConfig
    objective: str
    block_size: int
    world_size: int
    batch: BatchPlan
    max_steps: int
    val_every: int
    train: TrainSection
    trainer: TrainerSchema
    logger: LoggerSchema
    callbacks: CallbacksSchema
    paths: PathsSchema
    seed: int
    run_name: str
    resume: bool
    ckpt_path: str | None
    tags: dict[str, Any]
    init_from: str | None = None  # model.init_from: hf:PATH weights to start from
    precision_auto: str | None = None  # why trainer.precision=auto chose what it did (resolved at start)

    def with_vocab(self, vocab_size: int) -> ModelConfig:
        """The real ModelConfig once the tokenizer's vocabulary is known."""
        configured = self.model_fields.get("vocab_size")
        if self.init_from and configured is not None and configured < vocab_size:
            raise ValueError(
                f"model.init_from={self.init_from}: the model's vocabulary has {configured} ids "
                f"but tokenizer={self.tokenizer.name} has {vocab_size}; train with the tokenizer "
                "that model was trained with (for a scalelab export, the tokenizer its "
                "scalelab.json names) or start from a model whose vocabulary is large enough"
            )
        if configured is not None and configured < vocab_size:
            raise ValueError(
                f"model.vocab_size={configured} is smaller than the tokenizer's vocabulary "
                f"({vocab_size} ids); set model.vocab_size=null to take it from the tokenizer"
            )
        fields = dict(self.model_fields, vocab_size=configured or vocab_size)
        return ModelConfig(**fields)

    @property
    def fast_dev_run(self) -> bool:
        return bool(self.trainer.fast_dev_run)

    @property
    def saves_checkpoints(self) -> bool:
        """Lightning checkpoints are written (fast_dev_run writes none)."""
        return bool(self.callbacks.checkpoint.enabled) and not self.fast_dev_run


def _container(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}  # type: ignore[return-value]


def _typed(cls: type, values: dict[str, Any], group: str, *, open_keys: bool = False) -> Any:
    """``cls`` (a schema dataclass) from a plain dict, nested sections too. A key the schema does
    not know (``+train.max_step=5``: Hydra's ``+`` adds it even to a typed section) is refused
    naming the valid keys, except where ``open_keys`` leaves extras to their owner: ``+trainer.X``
    Lightning arguments (cli/trainer_args.py), ``+callbacks.X`` user callbacks
    (cli/user_callbacks.py)."""
    if not open_keys:
        _reject_unknown_keys(group, cls, values)
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            value, kind = values[f.name], hints[f.name]
            nested = dataclasses.is_dataclass(kind) and isinstance(value, dict)
            kwargs[f.name] = _typed(kind, value, f"{group}.{f.name}") if nested else value  # type: ignore[arg-type]
    return cls(**kwargs)


def world_size_of(trainer: TrainerSchema) -> int:
    """Processes in the run: devices per node x nodes (devices=auto counts what is visible;
    under torchrun, its WORLD_SIZE)."""
    from scalelab.training.devices import resolve_devices

    return int(resolve_devices(str(trainer.accelerator), trainer.devices, trainer.num_nodes)[2])


def _reject_unknown_keys(group: str, cls: type, fields: dict[str, Any]) -> dict[str, Any]:
    """`+model.typo=1` adds a key the schema does not know: name it instead of a TypeError."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"{group}.{unknown[0]}: no such key in {group} (drop the override "
                         f"+{group}.{unknown[0]}=...); valid keys: {', '.join(sorted(names))}")
    return fields


def _model(cfg: DictConfig) -> tuple[dict[str, Any], ModelConfig, str | None]:
    """(fields as configured, a validated ModelConfig, model.init_from)."""
    model_fields = _container(cfg.model)
    init_from = model_fields.pop("init_from", None)
    if init_from:
        model_fields = _hf_model_fields(str(init_from), model_fields)
    probe_fields = dict(model_fields)
    if probe_fields.get("vocab_size") is None:
        probe_fields["vocab_size"] = VOCAB_PLACEHOLDER
    _reject_unknown_keys("model", ModelConfig, probe_fields)
    return model_fields, ModelConfig(**probe_fields), init_from


def _component(group: str, cls: type, node: Any) -> Any:
    return cls(**_reject_unknown_keys(group, cls, _container(node)))


def _objective(configured: str | None, model: ModelConfig, data: DataConfig) -> str:
    objective = configured or OBJECTIVE_FOR_ARCH[model.arch]
    if objective not in OBJECTIVE_FOR_ARCH.values():
        raise ValueError(f"objective={objective!r}: choose causal, mlm or seq2seq (or null)")
    if OBJECTIVE_FOR_ARCH[model.arch] != objective:
        raise ValueError(
            f"objective={objective} does not fit model.arch={model.arch}: causal needs "
            "decoder, mlm needs encoder, seq2seq needs encoder_decoder (objective=null picks it)"
        )
    if (objective == "seq2seq") != data.is_seq2seq:
        need = "a seq2seq source (data=synthetic_seq2seq or data=parallel_text)" \
            if objective == "seq2seq" else "a text corpus, not a seq2seq source"
        raise ValueError(f"data.name={data.name}: objective={objective} needs {need}")
    return objective


def _block_size(train: TrainSection, objective: str, model: ModelConfig,
                init_from: str | None) -> int:
    block = int(train.block_size)
    if block < 1:
        raise ValueError(f"train.block_size={block}: must be >= 1")
    if init_from and objective != "seq2seq" and block > model.max_seq_len:
        # the HF model's position limit decides; the preset's block size is not the user's wish
        log.info("train.block_size=%d > the %d positions of model.init_from=%s: using %d",
                 block, model.max_seq_len, init_from, model.max_seq_len)
        return model.max_seq_len
    if objective != "seq2seq" and block > model.max_seq_len:
        raise ValueError(
            f"train.block_size={block} exceeds model.max_seq_len={model.max_seq_len}; lower "
            "train.block_size or raise model.max_seq_len"
        )
    return block


def _check_run_keys(train: TrainSection, logger: LoggerSchema) -> None:
    """Keys that need no derived value: checked before the device count (which loads Lightning)."""
    if int(train.val_every) < 1:
        raise ValueError(f"train.val_every={train.val_every}: must be >= 1 (optimizer steps)")
    if int(train.val_batches) < 1:
        raise ValueError(f"train.val_batches={train.val_batches}: must be >= 1")
    if logger.backend not in LOGGER_BACKENDS:
        raise ValueError(f"logger.backend={logger.backend!r}: choose mlflow or none (logger=none)")
    if not float(logger.metrics_interval_s) >= 0:
        raise ValueError(f"logger.metrics_interval_s={logger.metrics_interval_s}: seconds >= 0 "
                         "(0 sends metric values at every log step)")


def _max_steps(trainer: TrainerSchema, train: TrainSection, tokens_per_step: int) -> int:
    if trainer.max_steps is not None:
        steps = as_count("trainer.max_steps", trainer.max_steps)
    elif train.max_steps is not None:
        steps = as_count("train.max_steps", train.max_steps)  # 2e3 is a count too
    elif train.max_tokens is not None:
        steps = steps_from_budget(as_count("train.max_tokens", train.max_tokens), tokens_per_step)
    else:
        raise ValueError(
            "the run has no length: set train.max_steps=N or train.max_tokens=N "
            "(or trainer.max_steps=N)"
        )
    if steps is None or steps < 1:
        raise ValueError(f"max_steps={steps}: the run needs at least one optimizer step")
    return steps


def build_spec(cfg: DictConfig) -> RunSpec:
    """Validate every component of ``cfg``; raises ValueError naming the key and the fix."""
    model_fields, model, init_from = _model(cfg)
    data = _component("data", DataConfig, cfg.data)
    tokenizer = _component("tokenizer", TokenizerConfig, cfg.tokenizer)
    optim = _component("optim", OptimConfig, cfg.optim)
    objective = _objective(cfg.objective, model, data)
    top = _container(cfg)
    train = _typed(TrainSection, top["train"], "train")
    trainer = _typed(TrainerSchema, top["trainer"], "trainer", open_keys=True)
    logger = _typed(LoggerSchema, top["logger"], "logger")
    block = _block_size(train, objective, model, init_from)
    _check_run_keys(train, logger)
    world = world_size_of(trainer)
    batch = derive_batch(int(train.global_batch_size), train.micro_batch_size, world, block,
                         unit=str(train.batch_unit))
    steps = _max_steps(trainer, train, batch.tokens_per_step)
    build_lr_lambda(optim, steps)  # warmup longer than the run etc.
    return RunSpec(
        model_fields=model_fields, model=model, data=data, tokenizer=tokenizer, optim=optim,
        objective=objective, block_size=block, world_size=world, batch=batch, max_steps=steps,
        val_every=min(int(train.val_every), steps), init_from=init_from, train=train,
        trainer=trainer, logger=logger, callbacks=_typed(CallbacksSchema, top["callbacks"], "callbacks", open_keys=True),
        paths=_typed(PathsSchema, top["paths"], "paths"), seed=int(top["seed"]),
        run_name=check_run_name(str(top["run_name"])), resume=bool(top["resume"]), ckpt_path=top["ckpt_path"],
        tags=dict(top["tags"] or {}),
    )


def _hf_model_fields(init_from: str, configured: dict[str, Any]) -> dict[str, Any]:
    """model.init_from=hf:PATH: the shape comes from the HF config.json; only the training-time
    knobs (dropout, init_std) are kept from the configured model."""
    from scalelab.interop.hf_config import model_config_from_hf
    from scalelab.interop.hf_import import (
        HF_PREFIX,
        check_safetensors,
        read_hf_config,
        strip_prefix,
    )

    if not init_from.startswith(HF_PREFIX):
        raise ValueError(f"model.init_from={init_from}: use hf:PATH (a local Hugging Face folder)")
    try:
        _, hf_cfg = model_config_from_hf(read_hf_config(strip_prefix(init_from)))
        check_safetensors(strip_prefix(init_from))  # a tampered header: refused before the run
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"model.init_from={init_from}: {e}") from e
    keep = {k: configured[k] for k in ("dropout", "init_std") if k in configured}
    return {**hf_cfg.to_dict(), **keep}


def plain(obj: Any) -> Any:
    """Dataclasses, tuples and numpy scalars -> dict/list/int/float/str (torch weights_only safe)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if OmegaConf.is_config(obj):
        return OmegaConf.to_container(obj, resolve=True)
    if hasattr(obj, "__fspath__"):
        return str(obj)
    try:
        import torch

        if isinstance(obj, torch.Tensor):
            return obj
    except ImportError:  # pragma: no cover
        pass
    return repr(obj)


__all__ = ["OBJECTIVE_FOR_ARCH", "RunSpec", "build_spec", "plain", "world_size_of"]
