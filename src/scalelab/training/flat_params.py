"""AdamW over one flat tensor per parameter group: a small model's step without per-tensor work.

A small model's optimizer work is mostly per-tensor overhead: clipping takes a norm of every
gradient and scales each, AdamW runs its kernels once per parameter, zero_grad frees each
gradient. At a sweep point's shape (28 tensors, 5k parameters, a 3.5 ms step) that was ~0.4 ms
a step. :class:`FlatAdamW` lays each group's parameters out in one flat tensor; the module's
parameters become views into it, and their gradients views into one flat gradient, which autograd
accumulates into in place. Clipping and the update then see one tensor a group. The arithmetic is
AdamW's, element by element; only the clipping norm sums in another order (last-bit
differences).

What stays the same: the module, its ``state_dict`` and the checkpoint. ``state_dict()`` writes,
and ``load_state_dict()`` reads, the per-parameter layout a plain AdamW over the same groups has,
so a checkpoint resumes with or without flat groups.

What differs:
- ``zero_grad`` zeroes the flat gradient in place (gradients are never ``None``), so a parameter
  the loss does not reach gets a zero gradient rather than none, and AdamW still decays it and
  steps its moments (a per-parameter AdamW skips it). The platform's models reach all of theirs.
- Every parameter's ``.grad`` must stay its view. ``zero_grad`` puts back one that was replaced;
  ``step`` refuses to run when one was replaced after ``zero_grad`` (its gradient would have
  missed the flat buffer).
- One process only: DDP and FSDP own the gradients' layout (``optim.flat_params``).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

_GRAD = operator.attrgetter("grad")


@dataclass
class FlatGroup:
    """One optimizer group: the flat parameter the optimizer steps, its flat gradient, and the
    module's parameters with the gradient view each one must keep."""

    flat: nn.Parameter
    grad: torch.Tensor
    params: list[nn.Parameter]
    grad_views: list[torch.Tensor]

    def linked(self) -> bool:
        # map() over C callables: a check per parameter without a Python frame per parameter
        return all(map(operator.is_, map(_GRAD, self.params), self.grad_views))

    def relink(self) -> None:
        if self.flat.grad is not self.grad:
            self.flat.grad = self.grad
        if not self.linked():
            for p, v in zip(self.params, self.grad_views, strict=True):
                if p.grad is not v:
                    p.grad = v


def _kinds(params: Iterable[torch.Tensor]) -> set[tuple[torch.dtype, torch.device]]:
    return {(p.dtype, p.device) for p in params}


def fits_one_tensor(params: Iterable[torch.Tensor]) -> bool:
    """Whether ``params`` can share one flat tensor: one dtype and one device."""
    return len(_kinds(params)) == 1


def flatten(groups: list[list[nn.Parameter]]) -> tuple[torch.Tensor, list[FlatGroup]]:
    """Move every group's parameters into one flat tensor (values and any gradients kept), a
    slice of it per group; each parameter becomes a view of its group's slice, and its gradient
    a view of one flat gradient, returned first (one norm and one scale clip it all)."""
    params = [p for g in groups for p in g]
    if not fits_one_tensor(params):
        kinds = sorted(map(str, _kinds(params)))
        raise ValueError(f"optim.flat_params: the parameters mix dtypes/devices {kinds}; "
                         "set optim.flat_params=false")
    values = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    grads = torch.zeros_like(values)
    flat_groups, offset = [], 0
    with torch.no_grad():
        for group in groups:
            start, views = offset, []
            for p in group:
                n = p.numel()
                values[offset:offset + n].copy_(p.reshape(-1))
                view = grads[offset:offset + n].view(p.shape)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.data = values[offset:offset + n].view(p.shape)
                p.grad = view
                views.append(view)
                offset += n
            flat = nn.Parameter(values[start:offset])
            flat_groups.append(FlatGroup(flat, grads[start:offset], list(group), views))
            flat.grad = flat_groups[-1].grad
    return grads, flat_groups


class FlatAdamW(torch.optim.AdamW):
    """AdamW whose groups each step one flat parameter (see the module's docstring).

    ``groups`` are AdamW's parameter groups over the module's parameters; every other argument
    is AdamW's.
    """

    def __init__(self, groups: list[dict[str, Any]], **kwargs: Any) -> None:
        self.flat_grad, self.flat_groups = flatten([list(g["params"]) for g in groups])
        super().__init__([{**g, "params": [f.flat]} for g, f in zip(groups, self.flat_groups, strict=True)],
                         **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        # In place whatever set_to_none says: a freed gradient would unlink the module's views.
        self.flat_grad.zero_()
        for f in self.flat_groups:
            f.relink()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over every group's gradient (the same formula, with
        one norm and one scale instead of two kernels a tensor); returns the total norm."""
        norm = torch.linalg.vector_norm(self.flat_grad)
        self.flat_grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """AdamW's step, without torch's profiling wrapper unless something would see it.

        torch wraps every optimizer class's ``step`` in a ``record_function`` range and its step
        hooks. With no profiler running the range still enters and leaves torch's profiler ops:
        ~40 us of a 1.5 ms sweep-point step inside a run (2 %, py-spy, 2-core Zen 5 EPYC). The
        wrapped path runs when a profiler records or a step hook is registered."""
        return self._profiled_step(closure) if watched(self) else self._plain_step(closure)

    step.hooked = True  # type: ignore[attr-defined]  # torch's Optimizer then leaves it unwrapped

    @torch.no_grad()
    def _plain_step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not all(f.linked() for f in self.flat_groups):
            raise RuntimeError(
                "optim.flat_params: a parameter's .grad was replaced between zero_grad() and "
                "step(), so its gradient missed the flat buffer; set optim.flat_params=false")
        if not self._fused_step():
            _unhooked(torch.optim.AdamW.step)(self)  # this step's wrapper, if any, ran the hooks
        return loss

    _profiled_step = torch.optim.Optimizer.profile_hook_step(_plain_step)

    def _fused_step(self) -> bool:
        """AdamW's fused update, called straight: what ``torch.optim.AdamW.step`` does for a fused
        group once its state exists, without its Python around the kernel (grouping by device,
        flag checks: 36 -> 16 us a step for a sweep point's two groups). False (nothing done) where
        that path does more: the first step (state to create), AMP's grad scaling, amsgrad,
        maximize, capturable or differentiable groups, a tensor lr, or under torch.compile."""
        if torch.compiler.is_compiling() or getattr(self, "grad_scale", None) is not None \
                or getattr(self, "found_inf", None) is not None:
            return False
        states = [self.state.get(f.flat) for f in self.flat_groups]
        if not all(states) or not all(_plain_fused(g) for g in self.param_groups):
            return False
        torch._foreach_add_([st["step"] for st in states], 1)
        for group, f, st in zip(self.param_groups, self.flat_groups, states, strict=True):
            beta1, beta2 = group["betas"]
            torch._fused_adamw_([f.flat], [f.grad], [st["exp_avg"]], [st["exp_avg_sq"]], [], [st["step"]],
                                amsgrad=False, lr=group["lr"], beta1=beta1, beta2=beta2,
                                weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                                grad_scale=None, found_inf=None)
        return True

    def state_dict(self) -> dict[str, Any]:
        return unflatten_state(super().state_dict(), self.flat_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(flatten_state(state_dict, self.flat_groups))


def watched(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a profiler records or an optimizer step hook is registered (global or its own)."""
    return bool(torch._C._autograd._profiler_enabled() or _global_optimizer_pre_hooks
                or _global_optimizer_post_hooks or optimizer._optimizer_step_pre_hooks
                or optimizer._optimizer_step_post_hooks)


def _unhooked(step: Any) -> Any:
    """An optimizer class's ``step`` without the profiling and hook wrapper torch puts on it when
    the class's first instance is made."""
    return step.__wrapped__ if getattr(step, "hooked", False) else step


def _plain_fused(group: dict[str, Any]) -> bool:
    return bool(group["fused"]) and not any(group[k] for k in ("amsgrad", "maximize", "capturable", "differentiable")) \
        and group.get("decoupled_weight_decay", True) and not isinstance(group["lr"], torch.Tensor) \
        and not any(isinstance(b, torch.Tensor) for b in group["betas"])


def unflatten_state(state: dict[str, Any], groups: list[FlatGroup]) -> dict[str, Any]:
    """A flat optimizer ``state_dict`` in the per-parameter layout: each group's ``params`` the
    positions of its module parameters, each moment cut into one tensor per parameter."""
    new_state: dict[int, Any] = {}
    new_groups, index = [], 0
    for saved, group in zip(state["param_groups"], groups, strict=True):
        entry = state["state"].get(saved["params"][0])  # a group steps one flat parameter
        ids = list(range(index, index + len(group.params)))
        if entry is not None:
            offset = 0
            for i, p in zip(ids, group.params, strict=True):
                new_state[i] = {k: _cut(v, group.flat.numel(), offset, p) for k, v in entry.items()}
                offset += p.numel()
        new_groups.append({**saved, "params": ids})
        index += len(ids)
    return {**state, "state": new_state, "param_groups": new_groups}


def _cut(value: Any, total: int, offset: int, p: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == total:
        return value[offset:offset + p.numel()].view(p.shape)
    return value.clone() if isinstance(value, torch.Tensor) else value


def flatten_state(state: dict[str, Any], groups: list[FlatGroup]) -> dict[str, Any]:
    """A per-parameter optimizer ``state_dict`` (as :func:`unflatten_state` writes it, or a plain
    AdamW's) in the flat layout. A state that does not match the groups comes back unchanged,
    for torch to report."""
    saved_groups = state.get("param_groups", [])
    if [len(g.get("params", [])) for g in saved_groups] != [len(g.params) for g in groups]:
        return state
    new_state: dict[int, Any] = {}
    for pos, (saved, group) in enumerate(zip(saved_groups, groups, strict=True)):
        entries = [state.get("state", {}).get(i) for i in saved["params"]]
        present = [e for e in entries if e is not None]
        if present:
            new_state[pos] = _joined(entries, group.params, present)
    new_groups = [{**g, "params": [pos]} for pos, g in enumerate(saved_groups)]
    return {**state, "state": new_state, "param_groups": new_groups}


def _joined(entries: list[dict[str, Any] | None], params: list[nn.Parameter],
            present: list[dict[str, Any]]) -> dict[str, Any]:
    """One flat entry from per-parameter ones. A parameter with no entry (never stepped in a
    per-parameter AdamW) starts from zero moments; the step count is the group's largest."""
    out: dict[str, Any] = {}
    for key, value in present[0].items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            out[key] = torch.cat([(e[key] if e is not None else torch.zeros_like(p)).reshape(-1)
                                  for e, p in zip(entries, params, strict=True)])
        else:
            largest = max((e[key] for e in present), key=float)
            out[key] = largest.clone() if isinstance(largest, torch.Tensor) else largest
    return out
