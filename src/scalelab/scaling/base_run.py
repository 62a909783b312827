"""The base training config of a sweep (what ``scalelab-train <train_overrides>`` would run),
validated like ``scalelab-train`` validates it, its data prepared, and the plan built on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .plan import Plan
from .planner import make_plan
from .sweep_settings import RunSettings
from .sweep_spec import FamilyConfig, SweepSpec


@dataclass
class BaseRun:
    cfg: DictConfig
    model_fields: dict[str, Any]  # with the tokenizer's vocab_size filled in
    tokens_per_step: int
    micro_batch: int
    block_size: int
    train_tokens: int | None
    tracking_uri: str
    artifact_root: str | None
    root: Path
    accelerator: str
    val_tokens: Any = None  # the validation split's tokens (memmap), for the held-out set
    batch_unit: str = "sequences"  # what train.global_batch_size counts (sequences | tokens)
    batch_quantum: int = 1  # the global batch (sequences) must be a multiple of this
    seed: int = 0  # the configured seed: replicate r of a point trains with seed + r
    # the trainer's logging cadence: the floor of each point's (point_log_every); 50 is Lightning's
    log_every_n_steps: int = 50
    precision: str = "32-true"  # trainer.precision as configured (on a CPU, points run auto as 32-true)
    prepared_dir: Path | None = None  # the prepared data (tokenizer, splits); None for seq2seq


def resolve_base(train_overrides: list[str], progress: bool = True) -> BaseRun:
    """Validate the shared training config like `scalelab-train` does, and prepare its data."""
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec
    from scalelab.tracking.store import resolve_tracking_uri

    try:
        cfg = compose("train", train_overrides)
    except Exception as e:  # hydra's override/compose errors: say where they came from
        raise ValueError(f"sweep.train_overrides {train_overrides}: {e}") from None
    spec = build_spec(cfg)
    root = Path(str(cfg.paths.root))
    vocab, train_tokens, val_tokens, prepared_dir = spec.model.vocab_size, None, None, None
    if spec.objective != "seq2seq":
        from scalelab.data import prepare

        prepared = prepare(spec.data, spec.tokenizer, cache_dir=Path(str(cfg.paths.data_dir)),
                           progress=progress)
        vocab = prepared.vocab_size
        train_tokens = len(prepared.tokens("train"))
        val_tokens = prepared.tokens("val")
        prepared_dir = prepared.dir
    spec.with_vocab(vocab)  # validates
    # the fields as configured (n_kv_heads/d_ff may be null = derived), with the real vocab
    model_fields = dict(spec.model_fields, vocab_size=spec.model_fields.get("vocab_size") or vocab)
    uri = None
    if cfg.logger.backend == "mlflow":
        uri = resolve_tracking_uri(cfg.logger.tracking_uri, root)
    if uri is None:
        raise ValueError("sweeps need MLflow (logger=mlflow): the children and the parent run "
                         "are how a sweep records and skips points")
    return BaseRun(cfg, model_fields, spec.batch.tokens_per_step, spec.batch.micro_batch,
                   spec.block_size, train_tokens, uri,
                   str(cfg.logger.artifact_root) if cfg.logger.artifact_root else None, root,
                   str(cfg.trainer.accelerator), val_tokens, str(spec.train.batch_unit),
                   (spec.train.micro_batch_size or 1) * spec.world_size, int(cfg.seed),
                   int(cfg.trainer.get("log_every_n_steps") or 50), str(cfg.trainer.precision),
                   prepared_dir)


def build_plan(spec: SweepSpec, family: FamilyConfig, settings: RunSettings,
               base: BaseRun) -> Plan:
    identity = {"train_overrides": settings.train_overrides,
                "val_evals": settings.val_evals, "val_batches": settings.val_batches}
    return make_plan(spec, family, base.model_fields, base.tokens_per_step,
                     train_tokens=base.train_tokens, identity=identity, seq_len=base.block_size,
                     batch_quantum=base.batch_quantum)


def sweep_dir_of(settings: RunSettings, base: BaseRun) -> Path:
    if settings.output_dir:
        return Path(settings.output_dir).expanduser().resolve()
    return base.root / "sweeps" / settings.name
