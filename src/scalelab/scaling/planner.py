"""The planner: a sweep spec's compute budgets (or its N x D grid) -> the plan's points.

IsoFLOP mode (Chinchilla approach 2): for each budget C, K target sizes spaced evenly in log N
around the expected optimum N* (the size for which ``D = C / flops_per_token(N*)`` equals
``tokens_per_param * N*``; 20 is Chinchilla's D ~ 20N), each turned into a concrete shape
(d_model, n_layers) by the family's shape rule, and D chosen so that training FLOPs equal C.
Grid mode: an explicit N x D grid (for the parametric fit).

Pure Python on top of ``ModelConfig``, the single source of truth for N and FLOPs per token:
no Hydra, no MLflow, no torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from scalelab.model.config import ModelConfig
from scalelab.tracking.params import accounting

from .laws import read_laws
from .plan import Plan, PlanPoint, warmup_steps
from .shape_search import optimal_size_prior, params_of, shape_at, shape_for
from .sweep_spec import FamilyConfig, SweepSpec, require_positive_int


def make_plan(
    spec: SweepSpec,
    family: FamilyConfig,
    base_model: dict[str, Any],
    tokens_per_step: int,
    train_tokens: int | None = None,
    identity: dict[str, Any] | None = None,
    seq_len: int | None = None,
    batch_quantum: int = 1,
) -> Plan:
    """Build and validate the plan. Raises ValueError (naming the budget/point and the fix)
    for a plan that cannot be honoured, before anything runs.

    ``base_model``: ModelConfig fields shared by all points (vocab_size, max_seq_len, arch...).
    ``tokens_per_step``: global batch in tokens. ``train_tokens``: size of the train split (for
    the data-repetition check). ``identity``: extra content that makes two sweeps' points
    differ (e.g. the base train overrides); it enters every point hash. ``batch_quantum``: the
    global batch (sequences) must be a multiple of it (the tune stage's batch round).
    """
    require_positive_int("tokens_per_step", tokens_per_step)
    base = {k: v for k, v in dict(base_model).items() if k not in ("d_model", "n_layers", "n_heads")}
    shape_at(family.layer_choices[0], family.width_step, family, base)  # bad base fields fail here
    seq_len = int(seq_len or base.get("max_seq_len", ModelConfig.max_seq_len))
    points: list[PlanPoint] = []
    for label, assign in variant_grid(spec.variants):
        vmodel, vextra = split_variant(assign)
        vmodel |= _mup_head_dim(family, base | vmodel)
        vbase = base | vmodel
        _check_mup_lr_rule(spec, vbase)
        if spec.mode == "isoflop":
            for budget in sorted(spec.budgets):
                points += _isoflop_points(spec, family, vbase, tokens_per_step, budget, label,
                                          vmodel, vextra, seq_len)
        else:
            points += _grid_points(spec, family, vbase, tokens_per_step, label, vmodel, vextra,
                                   seq_len)
    for p in points:
        _set_schedule_and_check(p, spec, train_tokens)
    plan = Plan(spec, family, base, tokens_per_step, seq_len, points, train_tokens,
                identity=identity or {}, batch_quantum=int(batch_quantum))
    plan.finalize()
    if spec.lr_law is not None and not spec.tune_lr_factors:
        return plan.with_lr_law(**spec.lr_law)
    if spec.laws_from is not None and not spec.tune_lr_factors:
        laws = read_laws(spec.laws_from)
        missing = [v for v in plan.variants if v not in laws]
        if missing:
            raise ValueError(f"sweep.laws_from={spec.laws_from}: no laws for variant(s) {missing} "
                             f"(the file has {sorted(laws)}); tune them or drop sweep.laws_from")
        return plan.with_hparams({v: laws[v] for v in plan.variants})
    return plan


def split_variant(variant: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Variant keys -> (ModelConfig fields, other dotted overrides)."""
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    model, extra = {}, {}
    for key, value in variant.items():
        bare = key.removeprefix("model.")
        if bare in names:
            model[bare] = value
        elif key.startswith("model."):
            raise ValueError(f"sweep.variants.{key}: {bare!r} is not a ModelConfig field; valid "
                             f"fields are {sorted(names)}")
        else:
            extra[key] = value
    return model, extra


def variant_grid(variants: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Cross product of the variant axis -> [(label, {key: value})]; no axis -> [("default", {})]."""
    if not variants:
        return [("default", {})]
    keys = list(variants)
    out = []
    for combo in itertools.product(*(variants[k] for k in keys)):
        assign = dict(zip(keys, combo, strict=True))
        label = ",".join(f"{k.removeprefix('model.')}={v}" for k, v in assign.items())
        out.append((label, assign))
    return out


def _check_mup_lr_rule(spec: SweepSpec, model: dict[str, Any]) -> None:
    """µP already gives the hidden matrices lr * mup_base_width / d_model; the inverse-width
    rule on top would shrink their lr twice."""
    if model.get("parametrization") == "mup" and spec.lr_rule == "inverse_width":
        raise ValueError(
            "model.parametrization=mup scales the hidden matrices' lr by mup_base_width/d_model "
            "itself; set sweep.lr_rule=fixed (sweep.lr is then the lr tuned at "
            "model.mup_base_width)")


def _mup_head_dim(family: FamilyConfig, model: dict[str, Any]) -> dict[str, Any]:
    """The family fixes head_dim and adds heads, so µP's base model had that head_dim too; it
    goes into every point's model keys, so the attention scale stays 1/sqrt(head_dim) at every
    width instead of ModelConfig's default (n_heads fixed: scores shrink with width)."""
    if model.get("parametrization") == "mup" and model.get("mup_base_head_dim") is None:
        return {"mup_base_head_dim": family.head_dim}
    return {}


def _point(cfg: ModelConfig, budget: float, tokens: float, tps: int, variant: str,
           vmodel: dict[str, Any], extra: dict[str, Any], size_index: int,
           seq_len: int) -> PlanPoint:
    model_over = {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads}
    model_over |= vmodel
    steps = max(1, round(tokens / tps))
    return PlanPoint(
        variant=variant, budget=budget, n_layers=cfg.n_layers, d_model=cfg.d_model,
        n_heads=cfg.n_heads, **accounting(cfg, seq_len), tokens=steps * tps, steps=steps,
        tokens_per_step=tps, lr=0.0, warmup_steps=0, model_overrides=model_over,
        extra_overrides=dict(extra), size_index=size_index)


def _isoflop_points(spec: SweepSpec, family: FamilyConfig, base: dict[str, Any], tps: int,
                    budget: float, label: str, vmodel: dict[str, Any],
                    extra: dict[str, Any], seq_len: int) -> list[PlanPoint]:
    k = spec.sizes_per_budget
    centre = optimal_size_prior(budget, spec.tokens_per_param, family, base, spec.n_convention)
    half = math.log(spec.size_span) / 2
    targets = [centre * math.exp(-half + 2 * half * i / (k - 1)) if k > 1 else centre
               for i in range(k)]
    shapes = []
    for t in targets:
        try:
            shapes.append(shape_for(t, family, base, spec.n_convention))
        except ValueError as e:
            if spec.clip_sizes and "too small" in str(e):
                continue
            raise ValueError(f"budget C={budget:.3g} (variant {label}): {e}") from None
    if spec.clip_sizes:
        unique: dict[tuple[int, int], ModelConfig] = {}
        for cfg in shapes:
            unique.setdefault((cfg.n_layers, cfg.d_model), cfg)
        if spec.fill_sizes and k > 1:
            _fill_upward(unique, centre * math.exp(half), 2 * half / (k - 1), k, family, base,
                         spec.n_convention)
        shapes = sorted(unique.values(), key=lambda c: params_of(c, spec.n_convention))
        if len(shapes) < 3:
            raise ValueError(f"budget C={budget:.3g} (variant {label}): sweep.clip_sizes left "
                             f"{len(shapes)} sizes (< 3, no parabola); raise the budget or "
                             "sweep.size_span")
    keys = [(s.n_layers, s.d_model) for s in shapes]
    if len(set(keys)) != len(keys):
        raise ValueError(
            f"budget C={budget:.3g} (variant {label}): the {k} target sizes "
            f"{[f'{t:.3g}' for t in targets]} map to repeated shapes {keys}; the family is too "
            "coarse here. Lower sweep.family.head_dim/d_multiple, raise sweep.size_span, or "
            "raise the budget")
    out = []
    for i, cfg in enumerate(shapes):
        tokens = budget / cfg.flops_per_token(seq_len=seq_len)
        out.append(_point(cfg, budget, tokens, tps, label, vmodel, extra, i, seq_len))
    return out


def _fill_upward(shapes: dict[tuple[int, int], ModelConfig], top: float, log_step: float, k: int,
                 family: FamilyConfig, base: dict[str, Any], convention: str) -> None:
    """Add shapes at targets top * e^(j log_step), j = 1, 2, ... (the grid continued above its
    largest target) until ``shapes`` has k distinct ones; at most 2k tries, and none past the
    family's widest shape."""
    for j in range(1, 2 * k):
        if len(shapes) >= k:
            return
        try:
            cfg = shape_for(top * math.exp(j * log_step), family, base, convention)
        except ValueError:  # beyond the family's largest shape
            return
        shapes.setdefault((cfg.n_layers, cfg.d_model), cfg)


def _grid_points(spec: SweepSpec, family: FamilyConfig, base: dict[str, Any], tps: int,
                 label: str, vmodel: dict[str, Any], extra: dict[str, Any],
                 seq_len: int) -> list[PlanPoint]:
    out = []
    for i, n in enumerate(sorted(spec.grid_params)):
        cfg = shape_for(n, family, base, spec.n_convention)
        for d in sorted(spec.grid_tokens):
            steps = max(1, round(d / tps))
            c = float(cfg.flops_per_token(seq_len=seq_len) * steps * tps)
            out.append(_point(cfg, c, d, tps, label, vmodel, extra, i, seq_len))
    return out


def _set_schedule_and_check(p: PlanPoint, spec: SweepSpec, train_tokens: int | None) -> None:
    """lr and warmup per size, then the checks that make a plan impossible."""
    where = f"point (budget C={p.budget:.3g}, variant {p.variant}, d_model={p.d_model}, " \
            f"n_layers={p.n_layers}, N={p.n_params_matmul:,})"
    if spec.lr_rule == "fixed":
        p.lr = float(spec.lr)
    else:
        p.lr = float(spec.lr) * spec.base_width / p.d_model
        if spec.max_lr is not None:
            p.lr = min(p.lr, float(spec.max_lr))
    p.warmup_steps = warmup_steps(p, spec, p.steps, p.tokens_per_step)
    if p.steps < spec.min_steps:
        raise ValueError(
            f"{where}: only {p.steps} optimizer steps (D={p.tokens:,} tokens at "
            f"{p.tokens_per_step:,} tokens/step) < sweep.min_steps={spec.min_steps}. The budget is "
            "too small for this model: raise the budget or lower the global batch")
    tpp = p.tokens / p.n_params_matmul
    if tpp < spec.min_tokens_per_param:
        raise ValueError(
            f"{where}: D/N = {tpp:.2f} tokens per parameter < sweep.min_tokens_per_param="
            f"{spec.min_tokens_per_param}. The budget is too small for this model: raise the "
            "budget, lower sweep.size_span or sweep.tokens_per_param")
    if train_tokens is not None and p.tokens > train_tokens and not spec.allow_repeat:
        raise ValueError(
            f"{where}: D={p.tokens:,} tokens exceeds the corpus's {train_tokens:,} train tokens "
            f"({p.tokens / train_tokens:.2f} epochs). Use a bigger dataset, lower the budget, or "
            "set sweep.allow_repeat=true to repeat data")



def planned_point(plan: Plan, cfg: ModelConfig, budget: float) -> PlanPoint:
    """A point like ``plan``'s (its variant, batch and lr rule) for shape ``cfg`` at ``budget``:
    what the forecast stage trains beyond the study. It may repeat data (its epochs are
    reported); the study's own points may not unless sweep.allow_repeat is set."""
    ref = plan.points[0]
    vmodel = {k: v for k, v in ref.model_overrides.items()
              if k not in ("d_model", "n_layers", "n_heads")}
    tokens = budget / cfg.flops_per_token(seq_len=plan.seq_len)
    p = _point(cfg, budget, tokens, plan.tokens_per_step, ref.variant, vmodel,
               ref.extra_overrides, 0, plan.seq_len)
    _set_schedule_and_check(p, dataclasses.replace(plan.spec, allow_repeat=True), None)
    return p
