"""One fixed held-out token set for every point of a study, and its standard error.

Each point's in-training validation uses ``val_batches x micro_batch`` windows, so it depends on
the batch and is small (its noise was a large part of the spread of ``make sweep``'s fits).
Here every finished point's final checkpoint is scored, in the sweep process, on the same
``heldout_tokens`` tokens of the validation split: non-overlapping windows spread evenly over
the split. The standard error is the spread of the per-window mean losses over sqrt(windows)
(windows, not tokens, are the independent units: tokens of one window are correlated).

Only torch, the model and the checkpoint reader are imported here (lazily): no MLflow (the
caller logs the numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HELDOUT_KEYS = ("final/heldout_loss", "final/heldout_se", "final/heldout_tokens")


def window_count(n_tokens: int, block: int) -> int:
    """Windows in a held-out set of ``n_tokens`` tokens (at least 2, for a standard error)."""
    return max(2, int(n_tokens) // int(block))


@dataclass
class HeldoutSet:
    windows: np.ndarray  # int64 [n_windows, block + 1]

    @property
    def fingerprint(self) -> str:
        """12 hex digits of the windows' SHA-1: the same set gives the same string, so a point
        scored on another set (another size, split or corpus) is found and scored again."""
        import hashlib

        return hashlib.sha1(np.ascontiguousarray(self.windows).tobytes()).hexdigest()[:12]

    @property
    def n_tokens(self) -> int:
        """Predicted tokens: block tokens per window."""
        return int(self.windows.shape[0] * (self.windows.shape[1] - 1))

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, block: int, n_tokens: int) -> HeldoutSet:
        """``n_tokens // block`` non-overlapping windows spread evenly over ``tokens``."""
        n_windows = window_count(n_tokens, block)
        stride = len(tokens) // n_windows
        if stride < block + 1:
            fit = len(tokens) // (block + 1)
            raise ValueError(
                f"sweep.heldout_tokens={n_tokens:,}: the validation split holds only "
                f"{len(tokens):,} tokens, room for {fit:,} windows of {block + 1} "
                f"(~{fit * block:,} tokens); lower sweep.heldout_tokens or use more data")
        starts = np.arange(n_windows, dtype=np.int64) * stride
        idx = starts[:, None] + np.arange(block + 1, dtype=np.int64)[None]
        return cls(np.asarray(tokens[idx], dtype=np.int64))


def window_losses(model: Any, windows: np.ndarray, batch: int = 64) -> np.ndarray:
    """Mean next-token cross-entropy (nats) of each window."""
    import torch
    import torch.nn.functional as F

    out = []
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(windows), batch):
            x = torch.from_numpy(windows[i:i + batch])
            logits = model(x[:, :-1])
            ce = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(),
                                 reduction="none").view(x.shape[0], -1)
            out.append(ce.mean(dim=1).double().numpy())
    return np.concatenate(out)


def loss_and_se(per_window: np.ndarray) -> tuple[float, float]:
    """Mean of equal-length windows (= the token mean) and its standard error."""
    w = np.asarray(per_window, float)
    se = float(w.std(ddof=1) / math.sqrt(len(w))) if len(w) > 1 else float("nan")
    return float(w.mean()), se


def evaluate_checkpoint(ckpt_path: Path, heldout: HeldoutSet, threads: int = 1) -> dict[str, float]:
    """{final/heldout_loss, final/heldout_se, final/heldout_tokens} of one checkpoint."""
    import torch

    from scalelab.training.checkpoint import load_model

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        loss, se = loss_and_se(window_losses(load_model(ckpt_path), heldout.windows))
    finally:
        torch.set_num_threads(old)
    return dict(zip(HELDOUT_KEYS, (loss, se, float(heldout.n_tokens)), strict=True))


def measure_seconds_per_window(plan: Any, threads: int = 1,
                               batches: int = 2) -> dict[tuple[int, int, str], float]:
    """Seconds ``window_losses`` takes per window of ``plan.seq_len`` tokens, for each shape.

    Times ``batches`` batches of 64 random windows with ``threads`` threads, after one batch
    to warm up (allocations, kernels' first use)."""
    import time

    import torch

    from scalelab.model import ModelConfig, Transformer

    block, batch = int(plan.seq_len), 64
    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    out: dict[tuple[int, int, str], float] = {}
    try:
        for p in plan.points:
            key = (p.n_layers, p.d_model, p.variant)
            if key in out:
                continue
            cfg = ModelConfig.from_dict(plan.base_model | p.model_overrides)
            model = Transformer(cfg)
            windows = np.random.default_rng(0).integers(
                0, cfg.vocab_size, size=(batch * (batches + 1), block + 1), dtype=np.int64)
            window_losses(model, windows[:batch])
            t0 = time.perf_counter()
            window_losses(model, windows[batch:])
            out[key] = (time.perf_counter() - t0) / (batch * batches)
    finally:
        torch.set_num_threads(old)
    return out


def score_seconds(per_window: dict[tuple[int, int, str], float], n_tokens: int,
                  block: int, task_items: int = 0) -> dict[tuple[int, int, str], float]:
    """Seconds to score one checkpoint of each shape on a held-out set of ``n_tokens`` tokens
    (0: none) and on ``task_items`` items of the line-ending task (each item is one window of
    ``block`` tokens per choice: scaling/task_metric.py).

    The sweep scores in its own process while the runs train, so on a full machine this time
    is taken from them: the wall-time estimate counts it."""
    from scalelab.scaling.task_metric import CHOICES

    n = (window_count(n_tokens, block) if n_tokens else 0) + CHOICES * int(task_items)
    return {key: s * n for key, s in per_window.items()}
