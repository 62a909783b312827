"""A downstream task scored by the model's likelihood: pick the right ending of a held-out line.

Each item is a line of the validation split (text the study never trains on) whose last
``ending`` tokens are cut off. The model sees the ``block + 1 - ending`` tokens before them and
chooses among four endings of that length: the true one and the endings of three other held-out
lines. Equal lengths make summed log-likelihoods comparable without normalisation. Two numbers
come out: the task loss (nats per token of the true ending, the first step of a two-step
forecast, as in Bhagia et al. 2024) and the accuracy (chance is 1/4).

Only numpy and torch (lazily): the caller logs the numbers, as with scaling/heldout.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

TASK_KEYS = ("final/task_loss", "final/task_acc", "final/task_acc_se", "final/task_items")
CHOICES = 4
MIN_PREFIX = 4  # tokens of the line kept before its ending, so the line has begun


@dataclass
class ContinuationTask:
    sequences: np.ndarray  # int64 [items, CHOICES, block + 1]: context then one ending
    answer: np.ndarray  # int64 [items]: which of the CHOICES is the true ending
    ending: int  # tokens per ending (the last ``ending`` of each sequence)

    @property
    def fingerprint(self) -> str:
        """12 hex digits of the items' SHA-1 (like the held-out set's): another set is rescored."""
        import hashlib

        h = hashlib.sha1(np.ascontiguousarray(self.sequences).tobytes())
        h.update(np.ascontiguousarray(self.answer).tobytes())
        return h.hexdigest()[:12]

    @property
    def n_items(self) -> int:
        return int(self.answer.shape[0])

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, newline_id: int, block: int, n_items: int,
                    ending: int = 16, seed: int = 0) -> ContinuationTask:
        """``n_items`` lines spread evenly over ``tokens``, each with three other lines' endings."""
        if ending < 1 or block + 1 - ending < MIN_PREFIX:
            raise ValueError(f"sweep.task_ending={ending}: it must be >= 1 and leave at least "
                             f"{MIN_PREFIX} tokens of context in a block of {block}")
        toks = np.asarray(tokens)
        context = block + 1 - ending
        nl = np.flatnonzero(toks == newline_id)
        starts, ends = nl[:-1] + 1, nl[1:]  # a line: (newline, next newline)
        ok = (ends - starts >= ending + MIN_PREFIX) & (ends - ending >= context)
        starts, ends = starts[ok], ends[ok]
        if len(ends) < max(n_items, CHOICES):
            raise ValueError(f"sweep.task_items={n_items:,}: the validation split has only "
                             f"{len(ends):,} lines of >= {ending + MIN_PREFIX} tokens; lower "
                             "sweep.task_items or sweep.task_ending")
        pick = np.linspace(0, len(ends) - 1, n_items).round().astype(np.int64)
        rng = np.random.default_rng(seed)
        endings = ends[:, None] - ending + np.arange(ending)[None]  # index of every line's ending
        seqs = np.empty((n_items, CHOICES, block + 1), dtype=np.int64)
        answer = rng.integers(0, CHOICES, size=n_items)
        for i, line in enumerate(pick):
            cut = ends[line] - ending
            ctx = toks[cut - context:cut]
            true = toks[endings[line]]
            others = _distinct_endings(toks, endings, true, line, rng)
            options = [*others[:answer[i]], true, *others[answer[i]:]]
            for j, opt in enumerate(options):
                seqs[i, j, :context], seqs[i, j, context:] = ctx, opt
        return cls(seqs, answer.astype(np.int64), ending)


def _distinct_endings(toks: np.ndarray, endings: np.ndarray, true: np.ndarray, line: int,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """CHOICES - 1 endings of other lines, unlike the true one and each other."""
    out: list[np.ndarray] = []
    for _ in range(1000 * CHOICES):  # a corpus whose lines end alike runs out of distractors
        if len(out) == CHOICES - 1:
            break
        other = int(rng.integers(0, len(endings)))
        cand = toks[endings[other]]
        if other != line and not np.array_equal(cand, true) and \
                not any(np.array_equal(cand, o) for o in out):
            out.append(cand)
    if len(out) < CHOICES - 1:
        raise ValueError(f"the validation split's lines have too few distinct endings to draw "
                         f"{CHOICES - 1} wrong ones for each item; lower sweep.task_ending")
    return out


def ending_logprobs(model: Any, task: ContinuationTask, batch: int = 256) -> np.ndarray:
    """Summed log-likelihood of each choice's ending given its context, [items, CHOICES]."""
    import torch
    import torch.nn.functional as F

    flat = task.sequences.reshape(-1, task.sequences.shape[-1])
    out = []
    model.eval()
    with torch.inference_mode():
        for i in range(0, len(flat), batch):
            x = torch.from_numpy(flat[i:i + batch])
            logits = model(x[:, :-1])[:, -task.ending:].float()
            lp = -F.cross_entropy(logits.flatten(0, 1), x[:, -task.ending:].flatten(),
                                  reduction="none").view(x.shape[0], -1)
            out.append(lp.sum(dim=1).double().numpy())
    return np.concatenate(out).reshape(task.n_items, CHOICES)


def task_scores(logprobs: np.ndarray, task: ContinuationTask) -> dict[str, float]:
    """{final/task_loss, _acc, _acc_se, _items} from :func:`ending_logprobs`."""
    rows = np.arange(task.n_items)
    loss = float(-logprobs[rows, task.answer].mean() / task.ending)
    acc = float((logprobs.argmax(axis=1) == task.answer).mean())
    se = math.sqrt(max(acc * (1 - acc), 1e-12) / task.n_items)
    return dict(zip(TASK_KEYS, (loss, acc, se, float(task.n_items)), strict=True))


def evaluate_task(ckpt_path: Any, task: ContinuationTask, threads: int = 1) -> dict[str, float]:
    """The task's numbers for one checkpoint."""
    import torch

    from scalelab.training.checkpoint import load_model

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        return task_scores(ending_logprobs(load_model(ckpt_path), task), task)
    finally:
        torch.set_num_threads(old)
