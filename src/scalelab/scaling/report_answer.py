"""The report's first section: the answer in a few lines, each number with its interval.

Approach 2's exponents a and b, the forecast's L* at each target against its outcome (when the
sweep ran a forecast stage), and the hold-out check. The sections below say how each was made.
"""

from __future__ import annotations

import math
from typing import Any

from .fit import ScalingResults, VariantFit
from .fit_holdout import fmt_error


def answer_md(results: ScalingResults, forecast: Any = None) -> list[str]:
    """Markdown lines of the "Answer" section (``forecast``: a ForecastResult or None)."""
    ci = f"{results.options.ci:.0%}"
    multi = len(results.variants) > 1
    md = ["## Answer", ""]
    for vf in results.variants.values():
        tag = f"`{vf.variant}`: " if multi else ""
        md.append(f"- {tag}{_exponents(vf, ci)}")
    if forecast is not None:
        md += [f"- {line}" for line in forecast_lines(forecast.table)]
    for vf in results.variants.values():
        tag = f"`{vf.variant}`: " if multi else ""
        md.append(f"- {tag}{_holdout(vf, ci)}")
    return [*md, ""]


def _exponents(vf: VariantFit, ci: str) -> str:
    e = vf.estimates
    if "approach2.a" not in e:
        why = vf.skipped.get(2, "not fitted")
        return f"**a**: Approach 2 (IsoFLOP minima) skipped: {why}."
    return (f"**a = {e['approach2.a'].fmt()}** (N_opt ∝ C^a), b = {e['approach2.b'].fmt()} "
            f"(D_opt ∝ C^b): Approach 2 through the IsoFLOP minima, {ci} bootstrap intervals.")


def forecast_lines(table: Any) -> list[str]:
    """One line per target budget: L* forecast [95 %] and its outcome."""
    lines = []
    for r in table.itertuples():
        head = (f"**Forecast at {r.budget_multiple:g}x** (C = {r.budget:.3g} FLOPs): "
                f"L* = {r.loss_pred:.4f} [{r.loss_lo:.4f}, {r.loss_hi:.4f}] (95 %)")
        if math.isnan(r.loss_actual):
            lines.append(f"{head}; not trained.")
            continue
        covered = "covered" if r.loss_lo <= r.loss_actual <= r.loss_hi else "**not covered**"
        lines.append(f"{head}; actual {r.loss_actual:.4f} ({r.loss_actual / r.loss_pred - 1:+.2%}, "
                     f"{covered}).")
    return lines


def _holdout(vf: VariantFit, ci: str) -> str:
    ex = vf.extrapolation
    if ex is None:
        return ("**Hold-out check**: not run (it needs Approach 3 and enough points below the "
                "largest budget; `--no-extrapolate` turns it off).")
    interval = f" ({ci} bootstrap)" if ex.n_boot and math.isfinite(ex.error_ci[0]) else ""
    return (f"**Hold-out check**: fitted without C = {ex.held_out_budget:.3g}, Approach 3 "
            f"predicts its optimal loss {ex.predicted_loss:.4f} against {ex.actual_loss:.4f} "
            f"measured: error {fmt_error(ex.rel_error, ex.error_ci)}{interval}.")
