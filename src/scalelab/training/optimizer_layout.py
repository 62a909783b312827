"""Resume optimizer states saved before q, k and v became one parameter (``qkv_proj``).

A checkpoint's weights keep their layout (model/fused_layout.py), but an optimizer's state is
a list by parameter position: an older checkpoint has three entries (q, k, v) where the model
now has one. :func:`fuse_optimizer_state` rebuilds it for the current parameter groups,
concatenating each moment tensor along dim 0 as ``qkv_proj`` concatenates the weights, so the
run continues exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def fuse_optimizer_state(state: dict[str, Any], groups: Sequence[Sequence[torch.Tensor]],
                         splits: dict[int, tuple[int, ...]]) -> dict[str, Any]:
    """``state`` (an optimizer ``state_dict``) for the parameter ``groups`` of today's model.

    ``splits`` maps id(parameter) -> its parts for each fused parameter. A state that already
    matches the groups, or that matches neither layout, comes back unchanged (torch then
    reports the mismatch as usual).
    """
    old_groups = state.get("param_groups", [])
    if len(old_groups) != len(groups) or not _positional(old_groups):
        return state
    parts = [[len(splits.get(id(p), (0,))) for p in group] for group in groups]
    if [len(g["params"]) for g in old_groups] != [sum(n) for n in parts] \
            or all(len(n) == sum(n) for n in parts):
        return state
    old_state: dict[int, Any] = state.get("state", {})
    new_state: dict[int, Any] = {}
    new_groups, index = [], 0
    for old_group, counts in zip(old_groups, parts, strict=True):
        ids, j = [], 0
        for n in counts:
            entries = [old_state.get(i) for i in old_group["params"][j:j + n]]
            j += n
            if all(e is not None for e in entries):  # no entry: a step never taken
                new_state[index] = _joined(entries)
            ids.append(index)
            index += 1
        new_groups.append({**old_group, "params": ids})
    return {**state, "state": new_state, "param_groups": new_groups}


def _positional(groups: Sequence[dict[str, Any]]) -> bool:
    """Whether the state is keyed by parameter position (FSDP's by-name states are not)."""
    return all(isinstance(i, int) for g in groups for i in g.get("params", []))


def _joined(entries: list[dict[str, Any]]) -> dict[str, Any]:
    if len(entries) == 1:
        return entries[0]
    out: dict[str, Any] = {}
    for key, value in entries[0].items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            out[key] = torch.cat([e[key] for e in entries])
        else:  # the step count (a 0-d tensor or a number): the same for every part
            out[key] = value
    return out
