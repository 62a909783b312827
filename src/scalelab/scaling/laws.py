"""The tuned hyperparameter laws in the dict form the plan, law.json and sweep.lr_law carry:
{coef, exponent[, d_exponent]} for x*(N[, D]) = coef * N^exponent [* D^d_exponent].

Plain arithmetic, so that the planner can use them without numpy or pandas; N and D may be
floats or numpy arrays. ``read_laws`` reads them back from a tune stage's law.json
(sweep.laws_from).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
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


def read_laws(path: str) -> dict[str, dict[str, Any]]:
    """The per-variant hyperparameters of a tune stage's law.json, in the form
    :meth:`Plan.with_hparams` takes. Raises ValueError naming sweep.laws_from."""
    where = f"sweep.laws_from={path}"
    try:
        variants = json.loads(Path(path).read_text())["variants"]
        out: dict[str, dict[str, Any]] = {}
        for name, laws in variants.items():
            hp: dict[str, Any] = {k: {"coef": float(laws[k]["coef"]),
                                      "exponent": float(laws[k]["exponent"])}
                                  | ({"d_exponent": float(laws[k]["d_exponent"])}
                                     if laws[k].get("d_exponent") else {})
                                  for k in ("lr", "batch") if k in laws}
            if "beta2" in laws:
                hp["beta2"] = float(laws["beta2"]["best"])
            out[str(name)] = hp
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file; give the law.json of an earlier sweep's tune "
                         "stage (sweeps/<name>/tune/law.json)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not a tune stage's law.json ({type(e).__name__}: {e}); "
                         "expected {\"variants\": {name: {\"lr\": {coef, exponent}, ...}}}") from None
    if not out or not all(hp.get("lr") for hp in out.values()):
        raise ValueError(f"{where}: every variant needs at least an lr law (lr: {{coef, exponent}})")
    return out
