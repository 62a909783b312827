"""The LightningModule of a run (scalelab.training) and what is read back from it at the end.

Kept in one small file so a change of the training API touches only this module.
"""

from __future__ import annotations

import logging
from typing import Any

from scalelab.config.spec import RunSpec
from scalelab.data.bundle import DataBundle
from scalelab.model import ModelConfig

log = logging.getLogger("scalelab.train")


def build_module(spec: RunSpec, model_cfg: ModelConfig, data: DataBundle,
                 lr_segments: list[tuple[int, int]] | None = None) -> Any:
    """The LightningModule for ``spec.objective`` wrapping ``Transformer(model_cfg)``; its lr
    curve is ``lr_segments`` (a resumed run's) or one schedule over the run."""
    from scalelab.training import module_class

    sample = spec.callbacks.sample
    module = module_class(spec.objective)(
        model_cfg,
        spec.optim,
        total_steps=spec.max_steps,
        # bits per byte only means something for text corpora
        bytes_per_token=data.bytes_per_token if spec.objective == "causal" else None,
        compile=bool(spec.train.compile),
        compile_blocks_once=bool(spec.train.compile_blocks_once),
        activation_checkpointing=bool(spec.train.activation_checkpointing),
        tokenizer=data.tokenizer,
        sample_every_val=bool(sample.enabled),
        sample_prompt=str(sample.prompt),
        sample_tokens=int(sample.max_new_tokens),
        sample_temperature=float(sample.temperature),
        sample_top_k=sample.top_k,
        lr_segments=lr_segments,
    )
    if spec.init_from:  # model.init_from=hf:PATH (shape already taken from its config.json)
        from scalelab.interop.hf_import import load_into

        load_into(module.model, spec.init_from)
    return module


def final_sample(spec: RunSpec, module: Any, data: DataBundle) -> str:
    """Decoders: a text sample. Seq2seq: a few val sources with the greedy output."""
    import torch

    if not spec.callbacks.sample.enabled:
        return ""
    if module.weights_sharded():  # rank 0 alone cannot run sharded weights outside a forward
        log.info("no final sample: the weights are sharded; sample from the consolidated "
                 "checkpoint with scalelab-sample")
        return ""
    with torch.no_grad():
        if spec.objective == "causal":
            return module.sample(seed=spec.seed)
        if spec.objective == "seq2seq":
            return _seq2seq_examples(module, data)
    return ""


def _seq2seq_examples(module: Any, data: DataBundle) -> str:
    batch = next(iter(data.datamodule.val_dataloader()))
    batch = {k: v[:5].to(module.device) for k, v in batch.items()}
    module.eval()
    pred = module.greedy_decode(batch, batch["labels"].shape[1])
    vocab = data.tokenizer

    def text(ids: Any) -> str:
        keep = []
        for i in ids.tolist():
            if i == vocab.eos_id or i < 0:
                break
            keep.append(i)
        return vocab.decode(keep)

    lines = []
    for src, out, want in zip(batch["src_ids"], pred, batch["labels"], strict=True):
        got, exp = text(out), text(want)
        lines.append(f"{text(src)!r:>16} -> {got!r:<16} {'ok' if got == exp else 'want ' + repr(exp)}")
    return "\n".join(lines) + "\n"
