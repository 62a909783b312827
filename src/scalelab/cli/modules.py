"""The seam between the CLI and scalelab.training: which LightningModule, which callbacks.

Kept in one small file so a change of the training API touches only this module.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from scalelab.cli.spec import RunSpec


def build_module(cfg: DictConfig, spec: RunSpec, model_cfg: Any, data: dict[str, Any]) -> Any:
    """The LightningModule for ``spec.objective`` wrapping ``Transformer(model_cfg)``."""
    from scalelab.training import module_class

    s = cfg.callbacks.sample
    module = module_class(spec.objective)(
        model_cfg,
        spec.optim,
        total_steps=spec.max_steps,
        # bits per byte only means something for text corpora
        bytes_per_token=data["bytes_per_token"] if spec.objective == "causal" else None,
        compile=bool(cfg.train.compile),
        activation_checkpointing=bool(cfg.train.get("activation_checkpointing", False)),
        tokenizer=data["tokenizer"],
        sample_every_val=bool(s.enabled),
        sample_prompt=str(s.prompt),
        sample_tokens=int(s.max_new_tokens),
        sample_temperature=float(s.temperature),
        sample_top_k=s.top_k,
    )
    if spec.init_from:  # model.init_from=hf:PATH (shape already taken from its config.json)
        from scalelab.interop.hf_import import load_into

        load_into(module.model, spec.init_from)
    return module


def training_callbacks(cfg: DictConfig, spec: RunSpec, model_cfg: Any,
                       data: dict[str, Any]) -> list[Any]:
    """Throughput/MFU (perf/tokens_per_sec, perf/mfu) from scalelab.training."""
    from scalelab.training import ThroughputMonitor

    if not cfg.callbacks.throughput.enabled:
        return []
    return [ThroughputMonitor(every_n_steps=int(cfg.callbacks.throughput.window))]


def throughput_summary(callbacks: list[Any]) -> dict[str, float]:
    """Run averages measured by the ThroughputMonitor ({} when it did not run)."""
    from scalelab.training import ThroughputMonitor

    for cb in callbacks:
        if isinstance(cb, ThroughputMonitor):
            return dict(cb.summary)
    return {}


@torch.no_grad()
def final_sample(cfg: DictConfig, spec: RunSpec, module: Any, data: dict[str, Any]) -> str:
    """Decoders: a text sample. Seq2seq: a few val sources with the greedy output."""
    s = cfg.callbacks.sample
    if not s.enabled:
        return ""
    if spec.objective == "causal":
        return module.sample(seed=int(cfg.seed))
    if spec.objective == "seq2seq":
        dm = data["datamodule"]
        batch = next(iter(dm.val_dataloader()))
        batch = {k: v[:5].to(module.device) for k, v in batch.items()}
        module.eval()
        pred = module.greedy_decode(batch, batch["labels"].shape[1])
        vocab = data["tokenizer"]
        lines = []
        for src, out, want in zip(batch["src_ids"], pred, batch["labels"], strict=True):
            def text(ids: Any) -> str:
                keep = []
                for i in ids.tolist():
                    if i == vocab.eos_id or i < 0:
                        break
                    keep.append(i)
                return vocab.decode(keep)

            got, exp = text(out), text(want)
            lines.append(f"{text(src)!r:>16} -> {got!r:<16} {'ok' if got == exp else 'want ' + repr(exp)}")
        return "\n".join(lines) + "\n"
    return ""
