"""A fused parameter that saves and loads as its parts: one GEMM in training, the old keys on disk.

``SelfAttention`` computes q, k and v with one ``qkv_proj`` Linear. Its ``state_dict`` still holds
``q_proj``, ``k_proj`` and ``v_proj`` (in that order, before ``o_proj``), so checkpoints written
before and after the fusion, ``scalelab-export``'s ``model.pt`` and Hugging Face interop all see
one layout; ``load_state_dict`` takes either the parts or the fused tensor.

FSDP1 (Lightning's FSDPStrategy) looks its own parameter names up in the state dict after the
modules' hooks ran, so :func:`keep_fused` switches the split off before wrapping: its sharded
checkpoints hold ``qkv_proj``, which loads just the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

_SPEC = "_fused_layout"  # (fused name, part names, split sizes) on the module
_ON = "_fused_layout_on"
_SUFFIXES = ("weight", "bias")


def register(module: nn.Module, fused: str, parts: Sequence[str], splits: Sequence[int]) -> None:
    """Make ``module.<fused>`` (a Linear) save as ``parts``, row blocks of ``splits`` sizes."""
    setattr(module, _SPEC, (fused, tuple(parts), tuple(splits)))
    setattr(module, _ON, True)
    module.register_state_dict_post_hook(_split_on_save)
    module.register_load_state_dict_pre_hook(_join_on_load)


def keep_fused(model: nn.Module) -> None:
    """Save every fused parameter under its own name from now on (see the module docstring)."""
    for m in model.modules():
        if hasattr(m, _SPEC):
            setattr(m, _ON, False)


def fused_splits(model: nn.Module) -> dict[int, tuple[int, ...]]:
    """id(parameter) -> its parts' sizes along dim 0, for every fused parameter in ``model``."""
    out: dict[int, tuple[int, ...]] = {}
    for m in model.modules():
        spec = getattr(m, _SPEC, None)
        if spec is not None:
            for p in getattr(m, spec[0]).parameters(recurse=False):
                out[id(p)] = spec[2]
    return out


def _split_on_save(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                   local_metadata: Any) -> None:
    if not getattr(module, _ON):
        return
    fused, parts, splits = getattr(module, _SPEC)
    # This module's keys are the newest ones: re-insert them with the parts first, so the
    # order is the unfused module's (q, k, v, then o).
    own = {k: state_dict.pop(k) for k in [k for k in state_dict if k.startswith(prefix)]}
    pieces = {suffix: own.pop(f"{prefix}{fused}.{suffix}").split(splits, dim=0)
              for suffix in _SUFFIXES if f"{prefix}{fused}.{suffix}" in own}
    for i, part in enumerate(parts):
        for suffix, split in pieces.items():
            state_dict[f"{prefix}{part}.{suffix}"] = split[i]
    state_dict.update(own)


def _join_on_load(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any,
                  strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                  error_msgs: list[str]) -> None:
    fused, parts, splits = getattr(module, _SPEC)
    target = getattr(module, fused)
    for suffix in _SUFFIXES:
        keys = [f"{prefix}{part}.{suffix}" for part in parts]
        if not all(k in state_dict for k in keys):
            continue  # the fused layout (or keys missing, which load_state_dict reports)
        pieces = [state_dict.pop(k) for k in keys]
        current = getattr(target, suffix)
        bad = [(k, piece, n) for k, piece, n in zip(keys, pieces, splits, strict=True)
               if piece.shape[:1] != torch.Size([n]) or piece.shape[1:] != current.shape[1:]]
        for k, piece, n in bad:  # torch's own wording, naming the key the file holds
            want = torch.Size([n, *current.shape[1:]])
            error_msgs.append(f"size mismatch for {k}: copying a param with shape "
                              f"{piece.shape} from checkpoint, the shape in current model is {want}.")
        state_dict[f"{prefix}{fused}.{suffix}"] = current.detach() if bad else torch.cat(pieces)


def split_fused_keys(state_dict: dict[str, Any], fused: str, parts: Sequence[str],
                     splits: Sequence[int]) -> dict[str, Any]:
    """``state_dict`` with every ``*.<fused>.{weight,bias}`` replaced by its parts, in place of
    it (the layout :func:`keep_fused` switched off, e.g. in an FSDP1 sharded checkpoint)."""
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        stem, _, suffix = key.rpartition(".")
        head, _, name = stem.rpartition(".")
        if name != fused or suffix not in _SUFFIXES:
            out[key] = value
            continue
        prefix = f"{head}." if head else ""
        for part, piece in zip(parts, value.split(list(splits), dim=0), strict=True):
            out[f"{prefix}{part}.{suffix}"] = piece.clone()
    return out
