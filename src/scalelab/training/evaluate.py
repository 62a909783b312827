"""Held-out evaluation on a fixed, stated number of tokens, with standard errors.

The first ``n_tokens`` predicted tokens of a split, in contiguous windows of ``block_size``
(no sampling: two evaluations of one model give identical figures). The standard error is
over windows (tokens inside a window are correlated, windows far less), so it is honest
about how much the figure would move on another stretch of text. Losses are token-weighted
(as in training's validation); rows of unequal length (MLM, seq2seq) use the ratio
estimator's standard error.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class EvalResult:
    objective: str
    n_tokens: int  # predicted (causal) or masked (mlm) tokens scored
    n_windows: int
    loss: float
    loss_se: float
    perplexity: float
    perplexity_se: float
    bits_per_byte: float | None = None
    bits_per_byte_se: float | None = None
    masked_accuracy: float | None = None
    masked_accuracy_se: float | None = None
    exact_match: float | None = None
    exact_match_se: float | None = None

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items() if isinstance(v, (int, float))
                and not isinstance(v, bool)}


def _windows(tokens: np.ndarray, n_tokens: int, block_size: int) -> torch.Tensor:
    """[W, block_size + 1] contiguous windows covering the first W*block_size targets."""
    n_win = max(1, math.ceil(n_tokens / block_size))
    avail = (len(tokens) - 1) // block_size
    if avail < 1:
        raise ValueError(f"the split has {len(tokens)} tokens, fewer than block_size+1")
    n_win = min(n_win, avail)
    rows = [np.asarray(tokens[i * block_size:(i + 1) * block_size + 1], dtype=np.int64)
            for i in range(n_win)]
    return torch.from_numpy(np.stack(rows))


def _se(per_window: torch.Tensor) -> float:
    n = per_window.numel()
    return float(per_window.std(unbiased=True) / math.sqrt(n)) if n > 1 else float("nan")


def _ratio(sums: torch.Tensor, counts: torch.Tensor) -> tuple[float, float]:
    """Token-weighted mean sum(s_i)/sum(n_i) over rows of unequal length, and its standard
    error (the ratio estimator's: rows are the independent units)."""
    sums, counts = sums.double(), counts.double()
    mean = float(sums.sum() / counts.sum())
    k = sums.numel()
    if k < 2:
        return mean, float("nan")
    resid = sums - mean * counts
    return mean, float(resid.pow(2).sum().div(k - 1).sqrt() / counts.mean() / math.sqrt(k))


@torch.no_grad()
def evaluate_causal(model: torch.nn.Module, tokens: np.ndarray, n_tokens: int, block_size: int,
                    bytes_per_token: float | None = None, batch_size: int = 8,
                    device: str = "cpu") -> EvalResult:
    win = _windows(tokens, n_tokens, block_size)
    losses = []
    for i in range(0, len(win), batch_size):
        b = win[i:i + batch_size].to(device)
        logits = model(b[:, :-1]).float()
        nll = F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten(), reduction="none")
        losses.append(nll.view(b.shape[0], -1).mean(1).cpu())
    per = torch.cat(losses)
    loss, se = float(per.mean()), _se(per)
    res = EvalResult("causal", per.numel() * block_size, per.numel(), loss, se, math.exp(loss),
                     math.exp(loss) * se)
    if bytes_per_token:
        res.bits_per_byte = loss / math.log(2) / bytes_per_token
        res.bits_per_byte_se = se / math.log(2) / bytes_per_token
    return res


@torch.no_grad()
def evaluate_mlm(model: torch.nn.Module, tokens: np.ndarray, n_tokens: int, block_size: int,
                 tokenizer: object, mask_prob: float = 0.15, seed: int = 0, batch_size: int = 8,
                 device: str = "cpu") -> EvalResult:
    """Loss and accuracy on the masked tokens (BERT masking with a fixed seed); n_tokens counts
    input tokens, of which ~mask_prob are scored."""
    from scalelab.data.datamodules import mask_tokens

    win = _windows(tokens, n_tokens, block_size)[:, :-1]
    rng = np.random.default_rng(seed)
    sums, hits, counts = [], [], []
    for i in range(0, len(win), batch_size):
        batch = mask_tokens(win[i:i + batch_size], rng, mask_prob, tokenizer.mask_id,  # type: ignore[attr-defined]
                            tokenizer.n_base, tokenizer.special_ids)  # type: ignore[attr-defined]
        ids, labels = batch["input_ids"].to(device), batch["labels"].to(device)
        logits = model(ids).float()
        keep = labels != -100
        nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none",
                              ignore_index=-100).view_as(labels)
        sums.append(nll.sum(1).cpu())
        hits.append(((logits.argmax(-1) == labels) & keep).sum(1).cpu())
        counts.append(keep.sum(1).cpu())
    n = torch.cat(counts)
    loss, se = _ratio(torch.cat(sums), n)
    acc, acc_se = _ratio(torch.cat(hits), n)
    return EvalResult("mlm", int(n.sum()), n.numel(), loss, se, math.exp(loss), math.exp(loss) * se,
                      masked_accuracy=acc, masked_accuracy_se=acc_se)


@torch.no_grad()
def evaluate_seq2seq(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]],
                     eos_id: int, device: str = "cpu") -> EvalResult:
    """Teacher-forced loss per target token and greedy exact match per sequence (a sequence
    counts only if every target token and the final eos are right, as in training's val)."""
    sums, counts, exact = [], [], []
    for batch in batches:
        b = {k: v.to(device) for k, v in batch.items()}
        labels = b["labels"]
        logits = model(b["tgt_in"], attention_mask=b.get("tgt_mask"), src_ids=b["src_ids"],
                       src_mask=b.get("src_mask")).float()
        nll = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none",
                              ignore_index=-100).view_as(labels)
        keep = labels != -100
        sums.append(nll.sum(1).cpu())
        counts.append(keep.sum(1).cpu())
        steps = labels.shape[1]
        out = model.generate(b["tgt_in"][:, :1], steps, temperature=0.0,  # type: ignore[operator]
                             src_ids=b["src_ids"], src_mask=b.get("src_mask"),
                             eos_token_id=eos_id)[:, 1:]
        if out.shape[1] < steps:  # every row stopped early: pad with eos, as training does
            out = torch.cat([out, out.new_full((out.shape[0], steps - out.shape[1]), eos_id)], 1)
        exact.append((((out == labels) | ~keep).all(1)).float().cpu())
    n, em = torch.cat(counts), torch.cat(exact)
    loss, se = _ratio(torch.cat(sums), n)
    return EvalResult("seq2seq", int(n.sum()), n.numel(), loss, se, math.exp(loss), math.exp(loss) * se,
                      exact_match=float(em.mean()), exact_match_se=_se(em))
