"""LightningModules: one per objective, all wrapping the same ``Transformer(ModelConfig)``.

``LMModule`` holds what every objective shares: the optimizer and schedule, gradient clipping,
the train metrics (loss, perplexity, lr, grad norm, tokens seen) and token-weighted validation
metrics. Subclasses only say how a batch becomes a loss and what else validation measures.

    CausalLM  decoder,          batch {input_ids, labels}
    MaskedLM  encoder,          batch {input_ids, labels (-100 = not masked), attention_mask if padded}
    Seq2Seq   encoder_decoder,  batch {src_ids, src_mask, tgt_in, tgt_mask, labels (-100 = pad)}

Do not override ``on_before_batch_transfer`` here: the DataModules count consumed batches in
it (the data position that resumes from a checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace
from typing import Any, ClassVar

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.plugins.precision import MixedPrecision
from pytorch_lightning.strategies import FSDPStrategy
from torch import nn

from scalelab.model import ModelConfig, Transformer
from scalelab.model.fused_layout import fused_splits
from scalelab.model.variants import OBJECTIVE_OF_ARCH
from scalelab.training.checkpoint import STATE_KEY, module_state, read_module_state
from scalelab.training.config import OptimConfig
from scalelab.training.flat_params import FlatAdamW, fits_one_tensor
from scalelab.training.hook_plan import plain_setattr
from scalelab.training.lean_batch import lean_training_batch
from scalelab.training.lean_optimization import lean_automatic_optimization
from scalelab.training.lightning_fixes import (
    find_training_results_directly,
    fit_logs_this_step,
    remember_hook_signatures,
    skip_empty_module_hooks,
    skip_inherited_callback_hooks,
    skip_noop_batch_transfer,
    skip_noop_result_moves,
    skip_unchanged_step_metrics,
)
from scalelab.training.optim import GroupSummary, build_optimizer, param_groups
from scalelab.training.optimizer_layout import fuse_optimizer_state
from scalelab.training.schedules import build_lr_lambda

IGNORE_INDEX = -100
LN2 = math.log(2.0)
# Plain attributes written on every step: Lightning sets `_current_fx_name` before and after
# each hook it calls (~50 times a step), this module its counters. nn.Module.__setattr__ checks
# every write against parameters, buffers and submodules: 2.2 us against 0.2 us for a plain one.
_PLAIN_STEP_ATTRS = frozenset({"_current_fx_name", "_win_loss", "_win_n", "tokens_seen", "flops_seen"})


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float) -> float:
    """Bits per UTF-8 byte from a mean token loss in nats: loss / ln 2 / (bytes / token).

    It does not depend on the tokenizer, so runs with different vocabularies compare.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token={bytes_per_token!r}: must be > 0")
    return loss_nats_per_token / LN2 / bytes_per_token


def _as_model_cfg(cfg: ModelConfig | dict[str, Any]) -> ModelConfig:
    return cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(dict(cfg))


def _as_optim_cfg(cfg: OptimConfig | dict[str, Any] | None) -> OptimConfig:
    if cfg is None:
        return OptimConfig()
    return cfg if isinstance(cfg, OptimConfig) else OptimConfig.from_dict(dict(cfg))


def total_grad_norm(parameters: Any) -> torch.Tensor:
    """Total 2-norm over all gradients (one number, as clip_grad_norm_ sees it)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    full = getattr(norm, "full_tensor", None)  # DTensor (FSDP2): gather the global value
    return full() if callable(full) else norm


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
    ) -> None:
        super().__init__()
        skip_noop_result_moves()  # each self.log walked and deep-copied Lightning's holder
        skip_inherited_callback_hooks()  # 48 callback calls a step, 4 of them with code
        skip_unchanged_step_metrics()  # a gather and two .item() a step, for values unchanged
        skip_empty_module_hooks()  # ~12 module/strategy hooks a step, half of them empty
        lean_automatic_optimization()  # five layers that pass each optimizer step along
        lean_training_batch()  # the loop's own layers and lookups around each batch
        skip_noop_batch_transfer()  # four hook lookups and a new dict for a batch already there
        remember_hook_signatures()  # training_step's signature, read at every batch and self.log
        find_training_results_directly()  # which also finds its results through two properties
        mcfg, ocfg = _as_model_cfg(model_cfg), _as_optim_cfg(optim_cfg)
        self._check_args(mcfg, total_steps, bytes_per_token)
        self.model_cfg, self.optim_cfg = mcfg, ocfg
        self.total_steps = int(total_steps)
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
        # forward + loss as one compiled graph, built at the first training step; kept out of
        # _modules, so state_dict keys stay clean
        self._compiled_loss: Any = None

        # Counters over all devices and micro-batches; saved in checkpoints.
        self.tokens_seen: int = 0
        self.flops_seen: float = 0.0  # model FLOPs (training, ModelConfig.flops_per_token)
        self._flops_per_token: dict[int, int] = {}
        self.group_summary: GroupSummary | None = None
        self.last_sample: str | None = None
        self.samples: list[tuple[int, str]] = []  # (global_step, text) per validation
        self.last_val: dict[str, float] = {}  # the latest validation metrics, as floats
        self._win_loss: torch.Tensor | None = None  # loss sum over the accumulation window
        self._win_n = 0
        self._val: dict[str, torch.Tensor] = {}

    @plain_setattr  # hook_plan may write _current_fx_name to __dict__ itself
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PLAIN_STEP_ATTRS:  # never a parameter, buffer or submodule
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

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

    # --- model ---------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        # A prompt the tokenizer cannot encode should fail now, not at the first validation.
        if self.sample_every_val and self.tokenizer is not None and self.arch == "decoder":
            self._prompt_ids(self.sample_prompt)

    def _prompt_ids(self, prompt: str) -> list[int]:
        try:
            ids = [int(i) for i in self.tokenizer.encode(prompt)] if prompt else []
        except Exception as e:
            raise ValueError(f"sample_prompt={prompt!r} cannot be encoded by the tokenizer: {e}") from e
        bad = [i for i in ids if not 0 <= i < self.model_cfg.vocab_size]
        if bad:
            raise ValueError(
                f"sample_prompt={prompt!r} encodes to ids {bad} outside the model vocabulary "
                f"(vocab_size={self.model_cfg.vocab_size}); use a prompt the tokenizer knows"
            )
        if not ids:  # an empty prompt starts from the end-of-text token
            ids = [int(getattr(self.tokenizer, "eot_id", 0) or 0)]
        return ids

    def _train_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.use_compile:
            return self.token_loss_mean(self(batch), batch["labels"])
        if self._compiled_loss is None:
            # The loss compiles with the forward, so the cross-entropy fuses with the logits'
            # upcast: outside the graph it wrote and read the fp32 logits (3.3 GB a step at
            # GPT-2's 16 x 1024 x 50k). Built at the first step, from the module the strategy
            # has set up by then. Only training compiles: validation and sampling run eager.
            # Compiled, GPT-2 124M's validation events on an H200 averaged 13.4 s, by inference
            # mostly the no-grad graph's compile, for 6 forward passes at the defaults.
            self.__dict__["_compiled_loss"] = torch.compile(
                _train_loss(self.model, type(self).logits_of, self.token_loss_mean))
        return self._compiled_loss(batch)

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

    @staticmethod
    def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of token cross-entropies in nats, number of scored tokens)."""
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return loss, (labels != IGNORE_INDEX).sum()

    # Whether every label of a training batch is scored (no IGNORE_INDEX): the causal LM's are
    # the next tokens. Then the token mean is cross-entropy's own, and no batch has none scored.
    every_label_scored = False

    def token_loss_mean(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean token cross-entropy in nats over the scored labels; 0 where none is."""
        if self.every_label_scored:
            # One kernel and its backward, where the sum, count, clamp and divide take five:
            # 30-60 us of a sweep point's ~2.8 ms training step + backward on a 2-core Intel
            # Xeon (docs/performance.md, twenty-sixth session).
            # A batch with no scored label would read NaN here, which cannot happen.
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                   ignore_index=IGNORE_INDEX)
        loss_sum, n = self.token_loss_sum(logits, labels)
        return loss_sum / n.clamp(min=1)

    # --- training --------------------------------------------------------------------------
    def _world_size(self) -> int:
        return int(self._trainer.world_size) if self._trainer is not None else 1

    def _count(self, batch: dict[str, torch.Tensor]) -> None:
        tokens, seq_len = self.batch_tokens(batch)
        tokens *= self._world_size()  # every device processes a micro-batch of the same shape
        fpt = self._flops_per_token.get(seq_len)
        if fpt is None:
            fpt = self._flops_per_token[seq_len] = self.model_cfg.flops_per_token(
                training=True, seq_len=seq_len
            )
        self.tokens_seen += tokens
        self.flops_seen += float(fpt) * tokens

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._train_loss(batch)
        self._count(batch)
        d = loss.detach()
        self._win_loss = d if self._win_loss is None else self._win_loss + d
        self._win_n += 1
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Runs once per optimizer step, after all micro-batches' backward and AMP unscaling,
        # before clipping: the logged grad_norm is the unclipped one.
        if not self._logging_step():
            # Lightning writes step metrics only every log_every_n_steps: computing the grad
            # norm and logging 5 values on the other steps was pure per-step overhead.
            self._win_loss, self._win_n = None, 0
            return
        if self._win_loss is not None and self._win_n:
            loss = self._win_loss / self._win_n  # mean over the accumulation window
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
            self.log("train/ppl", torch.exp(loss.clamp(max=50.0)), on_step=True, on_epoch=False)
        self._win_loss, self._win_n = None, 0
        self.log("grad_norm", total_grad_norm(self.parameters()).float(), on_step=True, on_epoch=False)
        group = optimizer.param_groups[0]  # µP groups carry lr_scale: log the schedule's lr
        self.log("lr", float(group["lr"]) / group.get("lr_scale", 1.0), on_step=True, on_epoch=False)
        # float64 keeps token counts exact (float32 rounds above 2**24 = 16.7M).
        self.log("tokens_seen", torch.tensor(self.tokens_seen, dtype=torch.float64),
                 on_step=True, on_epoch=False)

    def _logging_step(self) -> bool:
        """Whether Lightning sends this optimizer step's metrics to the logger (its own
        every-``log_every_n_steps`` test) or it is the run's last step (final/train_loss)."""
        trainer = self._trainer
        if trainer is None:
            return True
        if trainer.max_steps > 0 and trainer.global_step + 1 >= trainer.max_steps:
            return True
        return fit_logs_this_step(trainer)

    def _clip_value(self) -> float:
        trainer = self._trainer
        if trainer is not None and trainer.gradient_clip_val is not None:
            return float(trainer.gradient_clip_val)
        return float(self.optim_cfg.grad_clip)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: int | float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Trainer(gradient_clip_val=...) wins when given; otherwise optim.grad_clip (by norm).
        if gradient_clip_val is None:
            if not self.optim_cfg.grad_clip:
                return
            gradient_clip_val, gradient_clip_algorithm = self.optim_cfg.grad_clip, "norm"
        if isinstance(optimizer, FlatAdamW) and str(gradient_clip_algorithm or "norm").lower() == "norm":
            if gradient_clip_val > 0:  # the same formula over one flat gradient (flat_params.py)
                optimizer.clip_grad_norm_(float(gradient_clip_val))
            return
        if isinstance(self.trainer.strategy, FSDPStrategy) and gradient_clip_val > 0:
            # Lightning's FSDPPrecision refuses norm clipping; the FSDP root module computes the
            # norm over every rank's shards (a local clip_grad_norm_ would see one shard only).
            if str(gradient_clip_algorithm or "norm").lower() == "value":
                torch.nn.utils.clip_grad_value_(self.parameters(), gradient_clip_val)
            else:
                self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
            return
        plugin = self.trainer.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.scaler is None and gradient_clip_val > 0:
            # bf16 autocast has no loss scaling, so clipping is safe with a fused optimizer;
            # Lightning's AMP plugin refuses fused + clipping for fp16 and bf16 alike.
            params = [p for g in optimizer.param_groups for p in g["params"]]
            if str(gradient_clip_algorithm or "norm").lower() == "value":
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
            else:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optim_cfg
        trainer = self._trainer
        scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        if scaler is not None and self._clip_value() > 0:
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
            self.model, cfg, hidden_lr_scale=1.0 / self.model.cfg.width_multiplier,
            flat=self._flat_params(cfg))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, build_lr_lambda(cfg, self.total_steps))
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1, "name": "lr"},
        }

    def _flat_params(self, cfg: OptimConfig) -> bool:
        """Whether the optimizer steps one flat tensor per group (training/flat_params.py):
        ``optim.flat_params``, or by default in a one-process run that does not compile (DDP
        and FSDP own the gradients' layout; Dynamo's handling of parameters that are views of one
        tensor is not measured)."""
        from pytorch_lightning.strategies import SingleDeviceStrategy

        trainer = self._trainer
        one_process = trainer is not None and isinstance(trainer.strategy, SingleDeviceStrategy)
        if cfg.flat_params is None:
            trainable = (p for p in self.model.parameters() if p.requires_grad)
            return one_process and not self.use_compile and fits_one_tensor(trainable)
        if cfg.flat_params and not one_process:
            name = type(trainer.strategy).__name__ if trainer is not None else "no trainer"
            raise ValueError(f"optim.flat_params=true needs a one-process run, not {name}; "
                             "set optim.flat_params=null or false")
        return bool(cfg.flat_params)

    def on_train_epoch_start(self) -> None:
        self._win_loss, self._win_n = None, 0

    # --- validation --------------------------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val = {}

    def _val_add(self, **values: torch.Tensor) -> None:
        for k, v in values.items():
            v = v.detach().double()
            self._val[k] = v if k not in self._val else self._val[k] + v

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        logits = self(batch)
        loss_sum, n = self.token_loss_sum(logits, batch["labels"])
        self._val_add(loss_sum=loss_sum, tokens=n)
        self.extra_validation(batch, logits)

    def extra_validation(self, batch: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
        """Subclass hook: accumulate more sums with ``self._val_add``."""

    def _reduced_val(self) -> dict[str, float]:
        keys = sorted(self._val)
        if not keys:
            return {}
        stacked = torch.stack([self._val[k] for k in keys])
        if self._trainer is not None and self.trainer.world_size > 1:
            stacked = self.trainer.strategy.reduce(stacked, reduce_op="sum")
        return {k: float(v) for k, v in zip(keys, stacked.tolist(), strict=True)}

    def val_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Turn global sums into metrics (token-weighted, exact over the whole val set)."""
        loss = sums["loss_sum"] / max(sums["tokens"], 1.0)
        out = {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0))}
        return out

    def on_validation_epoch_end(self) -> None:
        sums = self._reduced_val()
        if not sums:
            return
        metrics = self.val_metrics(sums)
        self.last_val = metrics
        for k, v in metrics.items():
            # already reduced over ranks above; every rank logs the same value
            self.log(k, v, prog_bar=(k == "val/loss"), sync_dist=True)
        self._val = {}
        trainer = self._trainer
        if (
            self.sample_every_val
            and self.tokenizer is not None
            and self.arch == "decoder"
            and trainer is not None
            and not trainer.sanity_checking
            and trainer.is_global_zero
            and not self.weights_sharded()
        ):
            self.last_sample = self.sample()
            self.samples.append((int(trainer.global_step), self.last_sample))

    def weights_sharded(self) -> bool:
        """FSDP/DeepSpeed/ModelParallel shard the weights: outside a forward (here, at
        validation end) rank 0 alone cannot run the model, so in-training samples are skipped."""
        from pytorch_lightning.strategies import DeepSpeedStrategy, ModelParallelStrategy

        return isinstance(self.trainer.strategy, (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy))

    # --- text ---------------------------------------------------------------------------
    @torch.no_grad()
    def sample(
        self,
        prompt: str | None = None,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = -1,
        seed: int = 1234,
    ) -> str:
        """Decode prompt + continuation (decoders; needs ``self.tokenizer``).

        Runs under a forked RNG with a fixed seed: sampling does not change the training
        random stream, so a run is the same with or without samples.
        """
        if self.tokenizer is None:
            raise RuntimeError("sample() needs a tokenizer: pass tokenizer= to the module")
        if not self.model.causal:
            raise RuntimeError(f"sample() needs a decoder; model.arch={self.model_cfg.arch!r}")
        ids = self._prompt_ids(self.sample_prompt if prompt is None else prompt)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = self.model.generate(
                x,
                self.sample_tokens if max_new_tokens is None else int(max_new_tokens),
                temperature=self.sample_temperature if temperature is None else float(temperature),
                top_k=self.sample_top_k if top_k == -1 else top_k,
                vocab_limit=getattr(self.tokenizer, "vocab_size", None),
            )
        return self.tokenizer.decode(out[0].tolist())

    # --- checkpoints ----------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[STATE_KEY] = module_state(self.objective, self.tokens_seen, self.flops_seen)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.tokens_seen, self.flops_seen = read_module_state(checkpoint)
        if checkpoint.get("optimizer_states"):  # saved before q, k, v were fused: re-index
            cfg = self.optim_cfg  # the groups configure_optimizers will build
            groups = [g["params"] for g in param_groups(
                self.model, cfg.weight_decay, cfg.decay_embeddings,
                1.0 / self.model.cfg.width_multiplier)[0]]
            splits = fused_splits(self.model)
            checkpoint["optimizer_states"] = [
                fuse_optimizer_state(s, groups, splits) for s in checkpoint["optimizer_states"]]


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
        self._val_add(correct=correct)

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
        self._val_add(exact=ok.all(dim=1).sum(), sequences=torch.tensor(labels.shape[0]))

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


def _train_loss(model: nn.Module, logits_of: Any, loss_mean: Any) -> Any:
    """``batch -> mean token loss``: what ``LMModule`` compiles as one graph."""

    def train_loss(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return loss_mean(logits_of(model, batch), batch["labels"])

    return train_loss
