"""The tuned hyperparameter laws in the dict form the plan, law.json and sweep.lr_law carry:
{coef, exponent[, d_exponent]} for x*(N[, D]) = coef * N^exponent [* D^d_exponent].

Plain arithmetic, so that the planner can use them without numpy or pandas; N and D may be
floats or numpy arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def law_value(law: Mapping[str, float], n: Any, d: Any = None) -> Any:
    """coef * N^exponent * D^d_exponent; ``d`` (tokens) is needed only when d_exponent is set."""
    out = float(law["coef"]) * n ** float(law["exponent"])
    q = float(law.get("d_exponent", 0.0))
    if q:
        if d is None:
            raise ValueError("a law in (N, D) needs the tokens D of the point")
        out = out * d**q
    return out


def law_text(law: Mapping[str, float], what: str, digits: int = 4) -> str:
    """e.g. lr*(N) = 0.31 * N^-0.2500, or lr*(N, D) = 0.31 * N^-0.2500 * D^+0.1000 (``what``:
    the symbol, lr or B; no unit)."""
    q = float(law.get("d_exponent", 0.0))
    head = f"{what}*(N, D)" if q else f"{what}*(N)"
    text = f"{head} = {float(law['coef']):.4g} * N^{float(law['exponent']):+.{digits}f}"
    return text + (f" * D^{q:+.{digits}f}" if q else "")
