"""LightningModules: one per objective, all wrapping the same ``Transformer(ModelConfig)``.

``LMModule`` holds what every objective shares: the optimizer and schedule, gradient clipping,
the train metrics (loss, perplexity, lr, grad norm, tokens seen) and token-weighted validation
metrics. Subclasses only say how a batch becomes a loss and what else validation measures.

    CausalLM  decoder,          batch {input_ids, labels}
    MaskedLM  encoder,          batch {input_ids, labels (-100 = not masked), attention_mask if padded}
    Seq2Seq   encoder_decoder,  batch {src_ids, src_mask, tgt_in, tgt_mask, labels (-100 = pad)}

Only Lightning's public hooks are used. Do not override ``on_before_batch_transfer`` here: the
DataModules count consumed batches in it (the data position that resumes from a checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any, ClassVar

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy
from torch import nn

from scalelab.model import ModelConfig, Transformer
from scalelab.model.variants import OBJECTIVE_OF_ARCH
from scalelab.training.checkpoint import STATE_KEY, module_state, read_module_state
from scalelab.training.clipping import clip_gradients
from scalelab.training.config import OptimConfig
from scalelab.training.losses import IGNORE_INDEX, CompiledLoss, token_loss_mean, token_loss_sum
from scalelab.training.metrics import (
    LossWindow,
    RunCounters,
    ValSums,
    bits_per_byte,
    total_grad_norm,
)
from scalelab.training.optim import GroupSummary, build_optimizer
from scalelab.training.sampling import prompt_ids, sample_text
from scalelab.training.schedules import Segments, segmented_lr_lambda

__all__ = ["IGNORE_INDEX", "OBJECTIVES", "CausalLM", "LMModule", "MaskedLM", "Seq2Seq",
           "bits_per_byte", "module_class", "total_grad_norm"]


def _as_model_cfg(cfg: ModelConfig | dict[str, Any]) -> ModelConfig:
    return cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(dict(cfg))


def _as_optim_cfg(cfg: OptimConfig | dict[str, Any] | None) -> OptimConfig:
    if cfg is None:
        return OptimConfig()
    return cfg if isinstance(cfg, OptimConfig) else OptimConfig.from_dict(dict(cfg))


class LMModule(pl.LightningModule):
    """Shared training logic. Use a subclass (CausalLM, MaskedLM, Seq2Seq).

    Args:
        model_cfg: ModelConfig (or its ``to_dict()``; that is how checkpoints store it).
        optim_cfg: OptimConfig (or a dict of its fields).
        total_steps: optimizer steps of the whole run; the schedule ends exactly there.
            With gradient accumulation this is ``trainer.max_steps`` (optimizer steps, not
            micro-batches). Use ``batch.steps_from_budget`` for a token budget.
        bytes_per_token: val UTF-8 bytes per token (``PreparedData.bytes_per_token``); enables
            ``val/bpb`` (causal LM only).
        compile: ``torch.compile`` the training step's forward and loss as one graph.
        compile_blocks_once: with ``compile``, trace one transformer block and reuse its compiled
            code for every layer (``Transformer.set_block_regions``).
        activation_checkpointing: recompute each block's activations in backward.
        tokenizer: anything with ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``;
            used for text samples (causal) and for the eos id (seq2seq). Not saved.
        sample_every_val / sample_prompt / sample_tokens: text sample at each validation end.
    """

    arch: ClassVar[str] = ""
    objective: ClassVar[str] = ""
    # Whether every label of a training batch is scored (no IGNORE_INDEX): the causal LM's are
    # the next tokens. Then the token mean is cross-entropy's own.
    every_label_scored: ClassVar[bool] = False

    def __init__(
        self,
        model_cfg: ModelConfig | dict[str, Any],
        optim_cfg: OptimConfig | dict[str, Any] | None = None,
        total_steps: int = 1,
        *,
        bytes_per_token: float | None = None,
        compile: bool = False,
        compile_blocks_once: bool = False,
        activation_checkpointing: bool = False,
        tokenizer: Any = None,
        sample_every_val: bool = True,
        sample_prompt: str = "\n",
        sample_tokens: int = 200,
        sample_temperature: float = 0.8,
        sample_top_k: int | None = 200,
        lr_segments: Segments | None = None,
    ) -> None:
        super().__init__()
        mcfg, ocfg = _as_model_cfg(model_cfg), _as_optim_cfg(optim_cfg)
        self._check_args(mcfg, total_steps, bytes_per_token)
        self.model_cfg, self.optim_cfg = mcfg, ocfg
        self.total_steps = int(total_steps)
        # the lr curve: one schedule over the run, or more after a resume that added steps
        self.lr_segments = [(int(a), int(b)) for a, b in lr_segments or [(0, self.total_steps)]]
        self.bytes_per_token = None if bytes_per_token is None else float(bytes_per_token)
        self.use_compile = bool(compile)  # not `self.compile`: nn.Module.compile is a method
        self.tokenizer = tokenizer
        self.sample_every_val = bool(sample_every_val)
        self.sample_prompt = sample_prompt
        self.sample_tokens = int(sample_tokens)
        self.sample_temperature = float(sample_temperature)
        self.sample_top_k = sample_top_k
        self._save_plain_hyperparameters(bool(activation_checkpointing), bool(compile_blocks_once))
        self.model = Transformer(mcfg)
        self.model.set_activation_checkpointing(activation_checkpointing)
        self.model.set_block_regions(bool(compile and compile_blocks_once))
        self.compiled_loss = CompiledLoss(self.model, type(self).logits_of, self.token_loss_mean)
        self.counters = RunCounters()  # saved in checkpoints (tokens_seen, flops_seen)
        self.world_size = 1  # the trainer's, read once per fit (setup), not once per step
        self.fitting = False  # inside Trainer.fit (training_step may also run on its own)
        self.loss_window = LossWindow()
        self.val_sums = ValSums()
        self.group_summary: GroupSummary | None = None
        self.last_sample: str | None = None
        self.samples: list[tuple[int, str]] = []  # (global_step, text) per validation
        self.last_val: dict[str, float] = {}  # the latest validation metrics, as floats

    def _check_args(self, mcfg: ModelConfig, total_steps: int, bytes_per_token: float | None) -> None:
        if self.arch and mcfg.arch != self.arch:
            raise ValueError(
                f"model.arch={mcfg.arch!r} does not fit the {self.objective} objective "
                f"({type(self).__name__}); it needs model.arch={self.arch!r}"
            )
        if isinstance(total_steps, bool) or int(total_steps) != total_steps or total_steps < 1:
            raise ValueError(
                f"total_steps={total_steps!r}: must be a positive integer (optimizer steps of the "
                "run, e.g. trainer.max_steps); the lr schedule is laid out over it"
            )
        if bytes_per_token is not None and not bytes_per_token > 0:
            raise ValueError(f"bytes_per_token={bytes_per_token!r}: must be > 0 or None")

    def _save_plain_hyperparameters(self, activation_checkpointing: bool, compile_blocks_once: bool) -> None:
        # Plain types only, so checkpoints load with torch.load(weights_only=True). The model
        # config is stored here only (see training.checkpoint).
        self.save_hyperparameters({
            "model_cfg": self.model_cfg.to_dict(),
            "optim_cfg": asdict(self.optim_cfg),
            "total_steps": self.total_steps,
            "lr_segments": [list(s) for s in self.lr_segments],
            "bytes_per_token": self.bytes_per_token,
            "compile": self.use_compile,
            "compile_blocks_once": compile_blocks_once,
            "activation_checkpointing": activation_checkpointing,
            "sample_every_val": self.sample_every_val,
            "sample_prompt": self.sample_prompt,
            "sample_tokens": self.sample_tokens,
            "sample_temperature": self.sample_temperature,
            "sample_top_k": self.sample_top_k,
        })

    @property
    def tokens_seen(self) -> int:
        """Tokens trained on so far, all devices and micro-batches."""
        return self.counters.tokens

    @tokens_seen.setter
    def tokens_seen(self, value: int) -> None:
        self.counters.tokens = int(value)

    @property
    def flops_seen(self) -> float:
        """Model training FLOPs so far (``ModelConfig.flops_per_token(training=True)``)."""
        return self.counters.flops

    @flops_seen.setter
    def flops_seen(self, value: float) -> None:
        self.counters.flops = float(value)

    # --- per-objective pieces ---------------------------------------------------------------
    @staticmethod
    def logits_of(net: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits [B, T, V] of ``net`` for a batch dict."""
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits [B, T, V] for a batch dict."""
        return self.logits_of(self.model, batch)

    def batch_tokens(self, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
        """(tokens this micro-batch processes on this device, sequence length for FLOPs)."""
        x = batch["input_ids"]
        return x.numel(), x.shape[1]

    token_loss_sum = staticmethod(token_loss_sum)

    def token_loss_mean(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean token cross-entropy in nats over the scored labels; 0 where none is."""
        return token_loss_mean(logits, labels, self.every_label_scored)

    # --- training --------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        # A prompt the tokenizer cannot encode should fail now, not at the first validation.
        if self.sample_every_val and self.tokenizer is not None and self.arch == "decoder":
            prompt_ids(self.tokenizer, self.sample_prompt, self.model_cfg.vocab_size)

    def on_train_start(self) -> None:
        # After a resume the optimizer's lr is the one the checkpoint saved, computed by the
        # run's earlier curve; a curve that changed at the join (train.resume_schedule=restart)
        # must already set the first resumed step's lr. A no-op for a fresh or unchanged run.
        for config in self.trainer.lr_scheduler_configs:
            sched = config.scheduler
            if isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
                for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs,
                                           sched.lr_lambdas, strict=True):
                    group["lr"] = base * fn(sched.last_epoch)

    def setup(self, stage: str) -> None:
        self.world_size, self.fitting = int(self.trainer.world_size), stage == "fit"

    def teardown(self, stage: str) -> None:
        self.fitting = False

    def on_train_epoch_start(self) -> None:
        self.loss_window.reset()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.use_compile:
            loss = self.compiled_loss(batch)
        else:
            loss = self.token_loss_mean(self(batch), batch["labels"])
        tokens, seq_len = self.batch_tokens(batch)
        # every device processes a micro-batch of the same shape
        self.counters.add(tokens * self.world_size, seq_len, self.model_cfg)
        if self.logs_this_step():  # only a logged step's micro-batch losses are kept and summed
            self.loss_window.add(loss)
        return loss

    def logs_this_step(self) -> bool:
        """Whether Lightning writes the metrics of the optimizer step under way (every
        ``log_every_n_steps``, and at a stop) or it is the run's last step (final/train_loss
        reads it). On the other steps the train metrics are not computed: no norm, no sync."""
        if not self.fitting:
            return True
        trainer = self.trainer
        every = trainer.log_every_n_steps
        step = trainer.global_step + 1  # the step about to be taken
        last = trainer.max_steps > 0 and step >= trainer.max_steps
        return last or trainer.should_stop or (every > 0 and step % every == 0)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Once per optimizer step, after every micro-batch's backward and AMP unscaling.
        loss = self.loss_window.take_mean()
        if loss is None:  # not a logging step
            return
        # not prog_bar=True: Lightning turns progress-bar values into Python floats at every
        # step (a host sync on a GPU); the platform's bars read trainer.callback_metrics
        self.log("train/loss", loss, on_step=True, on_epoch=False)
        self.log("train/ppl", torch.exp(loss.clamp(max=50.0)), on_step=True, on_epoch=False)
        group = optimizer.param_groups[0]  # µP groups carry lr_scale: log the schedule's lr
        self.log("lr", float(group["lr"]) / group.get("lr_scale", 1.0), on_step=True, on_epoch=False)
        # float64 keeps token counts exact (float32 rounds above 2**24 = 16.7M).
        self.log("tokens_seen", torch.tensor(self.tokens_seen, dtype=torch.float64),
                 on_step=True, on_epoch=False)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip by ``Trainer(gradient_clip_val=...)``, else ``optim.grad_clip`` (by norm), and log
        the unclipped total norm as ``grad_norm`` on logging steps (training/clipping.py)."""
        if gradient_clip_val is None:
            gradient_clip_val, gradient_clip_algorithm = self.optim_cfg.grad_clip, "norm"
        norm = clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)
        if self.logs_this_step():
            norm = total_grad_norm(self.parameters()) if norm is None else norm
            self.log("grad_norm", norm.float(), on_step=True, on_epoch=False)

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optim_cfg
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        clip = self.trainer.gradient_clip_val
        if scaler is not None and (clip if clip is not None else cfg.grad_clip):
            # fp16 loss scaling: a fused AdamW unscales inside step(), after clipping would
            # have run on scaled grads, so Lightning forbids the combination. Use foreach.
            if cfg.fused:
                raise ValueError(
                    "optim.fused=true cannot be combined with gradient clipping under "
                    "precision=16-mixed (the fused step unscales gradients itself); set "
                    "optim.fused=null, optim.grad_clip=0, or use precision=bf16-mixed"
                )
            cfg = replace(cfg, fused=False)
        opt, self.group_summary = build_optimizer(
            self.model, cfg, hidden_lr_scale=1.0 / self.model.cfg.width_multiplier)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, segmented_lr_lambda(cfg, self.lr_segments))
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1, "name": "lr"},
        }

    # --- validation --------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self.val_sums.reset()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        logits = self(batch)
        loss_sum, n = self.token_loss_sum(logits, batch["labels"])
        self.val_sums.add(loss_sum=loss_sum, tokens=n)
        self.extra_validation(batch, logits)

    def extra_validation(self, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        """Subclass hook: accumulate more sums with ``self.val_sums.add``."""

    def val_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Turn global sums into metrics (token-weighted, exact over the whole val set)."""
        loss = sums["loss_sum"] / max(sums["tokens"], 1.0)
        return {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0))}

    def on_validation_epoch_end(self) -> None:
        sums = self.val_sums.reduced(self.trainer)
        if not sums:
            return
        self.last_val = metrics = self.val_metrics(sums)
        for k, v in metrics.items():
            # already reduced over ranks above; every rank logs the same value
            self.log(k, v, prog_bar=(k == "val/loss"), sync_dist=True)
        self.val_sums.reset()
        trainer = self.trainer
        if (self.sample_every_val and self.tokenizer is not None and self.arch == "decoder"
                and not trainer.sanity_checking and trainer.is_global_zero and not self.weights_sharded()):
            self.last_sample = self.sample()
            self.samples.append((int(trainer.global_step), self.last_sample))

    def weights_sharded(self) -> bool:
        """FSDP/DeepSpeed/ModelParallel shard the weights: outside a forward (here, at
        validation end) rank 0 alone cannot run the model, so in-training samples are skipped."""
        return isinstance(self.trainer.strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy))

    # --- text ---------------------------------------------------------------------------
    def sample(self, prompt: str | None = None, max_new_tokens: int | None = None,
               temperature: float | None = None, top_k: int | None = -1, seed: int = 1234) -> str:
        """Decode prompt + continuation (decoders; needs ``self.tokenizer``); ``None`` (and
        ``top_k=-1``) take the module's sample settings. Seeded: training's RNG is untouched."""
        if self.tokenizer is None:
            raise RuntimeError("sample() needs a tokenizer: pass tokenizer= to the module")
        if not self.model.causal:
            raise RuntimeError(f"sample() needs a decoder; model.arch={self.model_cfg.arch!r}")
        ids = prompt_ids(self.tokenizer, self.sample_prompt if prompt is None else prompt,
                         self.model_cfg.vocab_size)
        return sample_text(
            self.model, self.tokenizer, ids, self.device,
            max_new_tokens=self.sample_tokens if max_new_tokens is None else int(max_new_tokens),
            temperature=self.sample_temperature if temperature is None else float(temperature),
            top_k=self.sample_top_k if top_k == -1 else top_k, seed=seed)

    # --- checkpoints ----------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[STATE_KEY] = module_state(self.objective, self.tokens_seen, self.flops_seen)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.tokens_seen, self.flops_seen = read_module_state(checkpoint)


class CausalLM(LMModule):
    """Next-token prediction with a decoder (GPT)."""

    arch = "decoder"
    objective = "causal"
    every_label_scored = True

    @staticmethod
    def logits_of(net: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return net(batch["input_ids"])

    def val_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().val_metrics(sums)
        if self.bytes_per_token is not None:
            out["val/bpb"] = bits_per_byte(out["val/loss"], self.bytes_per_token)
        return out


class MaskedLM(LMModule):
    """BERT-style masked-token prediction with an encoder; loss on the masked positions only."""

    arch = "encoder"
    objective = "mlm"

    @staticmethod
    def logits_of(net: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return net(batch["input_ids"], attention_mask=batch.get("attention_mask"))

    def extra_validation(self, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        labels = batch["labels"]
        scored = labels != IGNORE_INDEX
        correct = ((logits.argmax(-1) == labels) & scored).sum()
        self.val_sums.add(correct=correct)

    def val_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().val_metrics(sums)
        out["val/accuracy"] = sums.get("correct", 0.0) / max(sums["tokens"], 1.0)
        return out


class Seq2Seq(LMModule):
    """Encoder-decoder (2017 Transformer): teacher-forced loss; greedy exact match in validation.

    Token counts (tokens_seen, FLOPs) are target tokens, the ModelConfig convention for
    encoder-decoders (flops_per_token covers both stacks per target token).
    """

    arch = "encoder_decoder"
    objective = "seq2seq"

    def __init__(self, *args: Any, eos_token_id: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if eos_token_id is None and self.tokenizer is not None:
            eos_token_id = getattr(self.tokenizer, "eos_id", getattr(self.tokenizer, "eot_id", None))
        self.eos_token_id = eos_token_id
        self.hparams["eos_token_id"] = eos_token_id

    @staticmethod
    def logits_of(net: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return net(
            batch["tgt_in"],
            attention_mask=batch.get("tgt_mask"),
            src_ids=batch["src_ids"],
            src_mask=batch.get("src_mask"),
        )

    def batch_tokens(self, batch: dict[str, torch.Tensor]) -> tuple[int, int]:
        x = batch["tgt_in"]
        return x.numel(), x.shape[1]

    @torch.no_grad()
    def greedy_decode(self, batch: dict[str, torch.Tensor], max_new_tokens: int) -> torch.Tensor:
        """Greedy target tokens [B, max_new_tokens] (bos from tgt_in[:, 0]; eos-padded)."""
        out = self.model.generate(
            batch["tgt_in"][:, :1],
            max_new_tokens,
            temperature=0.0,
            src_ids=batch["src_ids"],
            src_mask=batch.get("src_mask"),
            eos_token_id=self.eos_token_id,
        )[:, 1:]
        if out.shape[1] < max_new_tokens:  # all rows ended early
            fill = self.eos_token_id if self.eos_token_id is not None else IGNORE_INDEX
            pad = out.new_full((out.shape[0], max_new_tokens - out.shape[1]), fill)
            out = torch.cat([out, pad], dim=1)
        return out

    def extra_validation(self, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        labels = batch["labels"]
        pred = self.greedy_decode(batch, labels.shape[1])
        ok = (pred == labels) | (labels == IGNORE_INDEX)  # positions after eos are -100
        self.val_sums.add(exact=ok.all(dim=1).sum(), sequences=torch.tensor(labels.shape[0]))

    def val_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        out = super().val_metrics(sums)
        out["val/exact_match"] = sums.get("exact", 0.0) / max(sums.get("sequences", 0.0), 1.0)
        return out


OBJECTIVES: dict[str, type[LMModule]] = {"causal": CausalLM, "mlm": MaskedLM, "seq2seq": Seq2Seq}
ARCH_TO_OBJECTIVE = OBJECTIVE_OF_ARCH  # the model's table: one owner of arch <-> objective


def module_class(objective_or_arch: str) -> type[LMModule]:
    """The LightningModule class for an objective (causal|mlm|seq2seq) or a model.arch."""
    key = ARCH_TO_OBJECTIVE.get(objective_or_arch, objective_or_arch)
    if key not in OBJECTIVES:
        raise ValueError(
            f"objective={objective_or_arch!r} is unknown; choose one of {sorted(OBJECTIVES)} "
            f"(or a model.arch: {sorted(ARCH_TO_OBJECTIVE)})"
        )
    return OBJECTIVES[key]
