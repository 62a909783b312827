"""Sides (1) and (2): a model in the training loop a hand-written script would have."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F


def loss_fn(side: str, objective: str) -> Any:
    """Cross-entropy of a batch; ``side`` "ref" is the hand-written model (no padding mask)."""
    def loss(model: torch.nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        if objective == "seq2seq":
            logits = model(b["tgt_in"], attention_mask=b.get("tgt_mask"), src_ids=b["src_ids"],
                           src_mask=b.get("src_mask"))
        elif objective == "mlm" and side == "model":
            logits = model(b["input_ids"], attention_mask=b.get("attention_mask"))
        else:
            logits = model(b["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1).float(), b["labels"].flatten(), ignore_index=-100)

    return loss


class PlainLoop:
    """A model + AdamW (the run's decay groups and settings) + gradient clipping, stepping over
    a fixed list of batches."""

    def __init__(self, model: torch.nn.Module, prep: dict[str, Any], side: str, device: str = "cpu",
                 amp: torch.dtype | None = None, compile: bool = False) -> None:
        from scalelab.training.optim import param_groups

        o = prep["spec"].optim
        self.model = model.to(device)
        # the run's own split (matrices decay; embeddings only with optim.decay_embeddings)
        groups, _ = param_groups(self.model, o.weight_decay, o.decay_embeddings)
        fused = o.fused is not False  # torch has fused AdamW kernels for CPU and CUDA
        self.opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                     fused=fused or None, foreach=None if fused else True)
        self.clip = float(o.grad_clip or 0.0)
        self.batches = [{k: v.to(device) for k, v in b.items()} for b in prep["batches"]]
        self.key = "tgt_in" if prep["spec"].objective == "seq2seq" else "input_ids"
        self.last_tokens = self.batches[0][self.key].numel()
        loss = partial(loss_fn(side, prep["spec"].objective), self.model)
        # compiled with its loss, as nanoGPT's forward returns it (the platform compiles the same)
        self.loss = torch.compile(loss) if compile else loss
        self.device, self.amp, self.i = device, amp, 0

    def step(self) -> torch.Tensor:
        b = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.last_tokens = b[self.key].numel()
        with torch.autocast(self.device, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            loss = self.loss(b)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def timed_turn(self, steps: int = 1) -> tuple[float, float, int]:
        """(wall s, CPU s, tokens) of ``steps`` steps, synchronized at both ends only: on a GPU
        the host's work for a step overlaps the previous step's kernels."""
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0, c0, tokens = time.perf_counter(), time.process_time(), 0
        for _ in range(steps):
            self.step()
            tokens += self.last_tokens
        sync()
        return time.perf_counter() - t0, time.process_time() - c0, tokens
