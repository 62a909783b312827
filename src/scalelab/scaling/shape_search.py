"""Shape search: the (n_layers, d_model) of a model family that realise a target parameter count,
and the compute-optimal size prior N* of a budget that centres each IsoFLOP curve."""

from __future__ import annotations

import math
from typing import Any

from scalelab.model.accounting import N_CONVENTIONS
from scalelab.model.config import ModelConfig

from .sweep_spec import FamilyConfig


def shape_for(target_n: float, family: FamilyConfig, base: dict[str, Any],
              convention: str = "matmul", strict: bool = True) -> ModelConfig:
    """The shape of the family closest to ``target_n`` parameters.

    For every allowed depth, the width (a multiple of the family's step) whose N is closest to
    the target in log space; among those, the one minimising
    ``(N error / 20 %)^2 + (aspect error / factor 2)^2`` (both in log space): N is hit closely
    while the shape stays near the rule, which a pure d = aspect * L rule cannot do at tiny
    sizes (there N jumps by ~((L+1)/L)^3 between depths).
    """
    step = family.width_step
    best: tuple[float, ModelConfig] | None = None
    for layers in family.layer_choices:
        cfg = _closest_width(target_n, layers, step, family, base, convention)
        if cfg is None:
            continue
        n_err = abs(math.log(params_of(cfg, convention) / target_n))
        if strict and n_err > math.log(1.5):  # this depth cannot reach the target
            continue
        aspect_err = abs(math.log((cfg.d_model / layers) / family.aspect_ratio))
        cost = (n_err / 0.2) ** 2 + (aspect_err / math.log(2)) ** 2
        if best is None or cost < best[0]:
            best = (cost, cfg)
    if best is None:
        smallest = shape_at(family.layer_choices[0], family.min_multiple * step, family, base)
        n_min = params_of(smallest, convention)
        if target_n < n_min:
            raise ValueError(
                f"target N={target_n:.3g} ({convention}) is too small for the smallest model of "
                f"the family (n_layers={smallest.n_layers}, d_model={smallest.d_model}, "
                f"N={n_min:.3g}). Raise the compute budget, lower sweep.size_span, or lower "
                "sweep.family.head_dim/min_layers/min_d_model")
        raise ValueError(
            f"target N={target_n:.3g} ({convention}) is beyond the largest shape of the family; "
            "raise sweep.family.max_layers/max_d_model or lower the budget")
    return best[1]


_CACHE: dict[tuple, ModelConfig] = {}


def shape_at(layers: int, d: int, family: FamilyConfig, base: dict[str, Any]) -> ModelConfig:
    """The family's model of ``layers`` x ``d`` on the base fields (cached: the search builds
    the same shapes many times)."""
    key = (layers, d, family.head_dim, tuple(sorted((k, repr(v)) for k, v in base.items())))
    if key not in _CACHE:
        fields_ = dict(base) | {"n_layers": layers, "d_model": d, "n_heads": d // family.head_dim}
        fields_.pop("d_ff", None)  # re-derived from the new width
        if fields_.get("n_kv_heads") is not None and fields_["n_heads"] % fields_["n_kv_heads"]:
            fields_["n_kv_heads"] = None
        _CACHE[key] = ModelConfig.from_dict(fields_)
    return _CACHE[key]


_N_CACHE: dict[tuple[int, str], int] = {}


def params_of(cfg: ModelConfig, convention: str) -> int:
    """N of ``cfg`` in ``convention`` (cached per shape)."""
    key = (id(cfg), convention)  # cfg objects live in _CACHE, so ids are stable
    if key not in _N_CACHE:
        _N_CACHE[key] = N_CONVENTIONS[convention].count(cfg)
    return _N_CACHE[key]


def _closest_width(target_n: float, layers: int, step: int, family: FamilyConfig,
                   base: dict[str, Any], convention: str) -> ModelConfig | None:
    # N grows monotonically with d: bisect on the multiple of `step`.
    lo, hi = family.min_multiple, max(family.min_multiple, family.max_d_model // step)
    if params_of(shape_at(layers, lo * step, family, base), convention) >= target_n:
        return shape_at(layers, lo * step, family, base)
    if params_of(shape_at(layers, hi * step, family, base), convention) < target_n:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if params_of(shape_at(layers, mid * step, family, base), convention) < target_n:
            lo = mid
        else:
            hi = mid
    a, b = shape_at(layers, lo * step, family, base), shape_at(layers, hi * step, family, base)
    ea = abs(math.log(params_of(a, convention) / target_n))
    eb = abs(math.log(params_of(b, convention) / target_n))
    return a if ea <= eb else b


def optimal_size_prior(budget: float, tokens_per_param: float, family: FamilyConfig,
                       base: dict[str, Any], convention: str = "matmul") -> float:
    """N* with C / flops_per_token(N*) = tokens_per_param * N*.

    flops_per_token is ~6N for big models but more at tiny ones (attention, the output layer),
    so N* is found by bisection in log N, taking flops_per_token from the family's nearest
    shape; the target itself stays continuous, which keeps the equation monotone.
    """
    def excess(log_n: float) -> float:
        cfg = shape_for(math.exp(log_n), family, base, convention, strict=False)
        return math.log(budget / cfg.flops_per_token()) - log_n - math.log(tokens_per_param)

    lo, hi = math.log(10.0), math.log(1e13)
    for _ in range(40):  # 28 e-folds / 2^40: far below the width granularity
        mid = (lo + hi) / 2
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)

