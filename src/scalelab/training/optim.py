"""AdamW with parameter groups: matrices decay; norms, biases and (by default) embeddings do not.

Weight decay on gains, biases and embedding rows mostly hurts (it pulls norms toward zero and
shrinks rare tokens' rows), so only weight matrices are decayed, as in GPT-2/nanoGPT/Llama recipes.

Under µP (``model.parametrization=mup``) the hidden matrices (every weight matrix except the
embeddings and the output layer) get their own group at lr / m; each group records its
``lr_scale`` so the logged lr is the schedule's, not one group's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scalelab.training.config import OptimConfig

# Parameters held directly (not in an nn.Embedding) that are embeddings by name.
_EMBED_NAME = re.compile(r"(^|\.)(wte|wpe|tok_emb\w*|pos_emb\w*|\w*embed\w*|\w*embedding\w*)(\.|$)")
# The output layer: µP scales its logits instead of its learning rate.
_OUTPUT_NAME = re.compile(r"(^|\.)lm_head\.")


@dataclass(frozen=True)
class GroupSummary:
    """How many tensors / scalars land in each group (logged so a run shows what was decayed)."""

    decay_tensors: int
    decay_params: int
    no_decay_tensors: int
    no_decay_params: int
    decay_names: tuple[str, ...]
    no_decay_names: tuple[str, ...]

    def as_dict(self) -> dict[str, int]:
        return {
            "decay_tensors": self.decay_tensors,
            "decay_params": self.decay_params,
            "no_decay_tensors": self.no_decay_tensors,
            "no_decay_params": self.no_decay_params,
        }


def _embedding_param_ids(model: nn.Module) -> set[int]:
    ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    ids |= {id(p) for n, p in model.named_parameters() if _EMBED_NAME.search(n)}
    return ids


def param_groups(
    model: nn.Module, weight_decay: float, decay_embeddings: bool = False,
    hidden_lr_scale: float = 1.0,
) -> tuple[list[dict[str, Any]], GroupSummary]:
    """Split trainable parameters into a decayed and a non-decayed AdamW group.

    A parameter shared by two modules (tied input/output embedding) appears once; it counts
    as an embedding, so it follows ``decay_embeddings``. With ``hidden_lr_scale != 1`` (µP)
    the decayed hidden matrices move to a third group whose ``lr_scale`` is that factor.
    """
    embed_ids = _embedding_param_ids(model)
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    # named_parameters() already yields a shared tensor once (remove_duplicate=True).
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_embedding = id(p) in embed_ids
        # FSDP flattens parameters to 1-D shard views; distributed.py recorded the real ndim.
        ndim = getattr(p, "scalelab_orig_ndim", p.ndim)
        if ndim >= 2 and (decay_embeddings or not is_embedding):
            decay.append((name, p))
        else:
            no_decay.append((name, p))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": weight_decay, "name": "decay"},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0, "name": "no_decay"},
    ]
    if hidden_lr_scale != 1.0:
        groups = _split_hidden(groups[0], decay, embed_ids, hidden_lr_scale) + groups[1:]
    groups = [g for g in groups if g["params"]]
    summary = GroupSummary(
        decay_tensors=len(decay),
        decay_params=sum(p.numel() for _, p in decay),
        no_decay_tensors=len(no_decay),
        no_decay_params=sum(p.numel() for _, p in no_decay),
        decay_names=tuple(n for n, _ in decay),
        no_decay_names=tuple(n for n, _ in no_decay),
    )
    return groups, summary


def _split_hidden(group: dict[str, Any], named: list[tuple[str, nn.Parameter]],
                  embed_ids: set[int], lr_scale: float) -> list[dict[str, Any]]:
    """The decayed group as [other matrices (lr_scale 1), hidden matrices (lr_scale)]."""
    hidden = [p for n, p in named if id(p) not in embed_ids and not _OUTPUT_NAME.search(n)]
    hidden_ids = {id(p) for p in hidden}
    rest = [p for _, p in named if id(p) not in hidden_ids]
    return [{**group, "params": rest},
            {**group, "params": hidden, "name": "decay_hidden", "lr_scale": lr_scale}]


# Device types with a fused AdamW kernel in torch (float16/bfloat16/float32/float64 parameters).
# AdamW itself checks only at its first step, too late for a clear configuration error.
FUSED_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu", "hpu"})


def fused_available(params: list[torch.Tensor]) -> bool:
    """Whether torch has a fused AdamW kernel for every parameter's device and dtype."""
    return bool(params) and all(p.device.type in FUSED_DEVICES and torch.is_floating_point(p)
                                for p in params)


def build_optimizer(model: nn.Module, cfg: OptimConfig,
                    hidden_lr_scale: float = 1.0) -> tuple[torch.optim.AdamW, GroupSummary]:
    """``torch.optim.AdamW`` over :func:`param_groups`. ``hidden_lr_scale`` is µP's 1/m for the
    hidden matrices (1.0: one lr for all).

    ``optim.fused``: true = torch's fused kernel (one kernel per group and step), false =
    ``foreach``, null = fused where torch has it for the parameters, else ``foreach``.
    """
    groups, summary = param_groups(model, cfg.weight_decay, cfg.decay_embeddings, hidden_lr_scale)
    for g in groups:
        g["lr"] = cfg.lr * g.get("lr_scale", 1.0)
    params = [p for g in groups for p in g["params"]]
    fused = fused_available(params) if cfg.fused is None else cfg.fused
    if fused and not fused_available(params):
        devs = sorted({p.device.type for p in params})
        raise ValueError(
            f"optim.fused=true but torch {torch.__version__} has no fused AdamW for device(s) {devs}; "
            "set optim.fused=null (auto) or false"
        )
    kind: dict[str, Any] = {"fused": True} if fused else {"foreach": True}
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kind)
    return opt, summary
