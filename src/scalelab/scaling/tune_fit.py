"""Fits of the tune stage: the optimum of a 1-D log grid, power laws over sizes, beta2's choice.

Per size (one variant, one tune budget), a parabola in log x through the final losses of a grid
of x (the peak lr, or the global batch) gives x*(N); a least-squares line in log-log space over
the sizes gives x*(N) = coef * N^exponent. With optima from two or more tune budgets, the same N
is seen at several token counts D, and the fit is a plane: x*(N, D) = coef * N^exponent *
D^d_exponent. One budget cannot separate the two, since along an IsoFLOP curve D ~ C / N, and
the optimal lr falls and the optimal batch grows with the training horizon. Neither law carries
far beyond the tuned budgets: on cpu_medium a plane fitted at 4e9 and 4e10 made the 4e11 points
up to 3.9 % worse (docs/scaling-study.md). beta2 is one value
per variant: the grid value with the lowest mean excess loss over the sizes. Pure numpy/pandas;
no training, no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .laws import law_text, law_value

# the run column each power law is fitted to, and the sweep key of its grid (for the flags)
GRID_KEYS = {"lr": "sweep.tune_lr_factors", "batch": "sweep.tune_batch_factors"}
# A line through interior optima only if there are this many sizes spanning this factor in N.
# Two neighbouring sizes alone extrapolate wildly: cpu_medium's batch round once had 2 interior
# optima (N = 528 and 772) and 4 at the grid's small edge, and the line through the 2 gave
# B*(N) ~ N^+0.98, i.e. 20x the batch at N = 16k, where every size said "smaller".
MIN_INTERIOR, MIN_SPAN = 3, 4.0
MIN_PLANE = 4  # optima for a plane in (log N, log D): 3 coefficients and a spare degree


@dataclass
class PowerLaw:
    """x*(N[, D]) = coef * N^exponent [* D^d_exponent] for x = ``what`` (lr or batch), and the
    per-size optima. d_exponent is 0 unless the optima came from two or more tune budgets."""

    what: str  # lr | batch
    coef: float
    exponent: float
    sizes: pd.DataFrame  # N, budget, D, <what>_opt, loss_opt, n_grid, flagged, reason, used
    basis: str = "interior"  # interior: the line runs through interior optima only; all: edges too
    d_exponent: float = 0.0

    def __call__(self, n, d=None) -> np.ndarray:
        tokens = None if d is None else np.asarray(d, float)
        return law_value(self.law(), np.asarray(n, float), tokens)

    def law(self) -> dict[str, float]:
        """The dict form the plan and law.json carry."""
        out = {"coef": self.coef, "exponent": self.exponent}
        return out | ({"d_exponent": self.d_exponent} if self.d_exponent else {})

    def as_dict(self) -> dict:
        return self.law() | {"basis": self.basis, "sizes": self.sizes.to_dict("records")}

    def describe(self) -> str:
        """e.g. lr*(N) = 0.31 * N^-0.2500, B*(N, D) = 2.1 * N^-0.3000 * D^+0.2000 sequences."""
        name, unit = {"lr": ("lr", ""), "batch": ("B", " sequences")}[self.what]
        return law_text(self.law(), name) + unit

    def basis_note(self) -> str:
        """Why the law runs through edge optima too, and why optima of several budgets gave no
        D term; "" when neither applies."""
        notes = []
        if self.basis != "interior":
            notes.append(f"fewer than {MIN_INTERIOR} interior optima spanning {MIN_SPAN:g}x in N: "
                         f"fitted through every size's best, edges included; widen "
                         f"{GRID_KEYS[self.what]}")
        used = self.sizes[self.sizes["used"]] if "used" in self.sizes else self.sizes
        if not self.d_exponent and "budget" in used and used["budget"].nunique() >= 2:
            notes.append(f"no law in (N, D): it needs >= {MIN_PLANE} usable optima over >= 2 "
                         "budgets, with their token counts; a line in N alone")
        return "; ".join(notes)


@dataclass
class Beta2Choice:
    """The beta2 with the lowest mean loss over the sizes, each size's loss taken relative to
    its own best (loss / best - 1, so a small model's higher loss does not outweigh the rest)."""

    best: float
    table: pd.DataFrame  # beta2, mean_rel_excess (mean of loss / size's best - 1), n_sizes

    def as_dict(self) -> dict:
        return {"best": self.best, "table": self.table.to_dict("records")}


def grid_optimum(
    x: np.ndarray, loss: np.ndarray, grid_key: str = GRID_KEYS["lr"]
) -> tuple[float, float, str]:
    """(x*, loss at x*, flag reason or "") from a parabola in log x through a 1-D grid's losses.

    No interior minimum of the parabola (or fewer than 3 grid values): the grid's best x,
    flagged; at the edge of the grid the flag says to widen ``grid_key``."""
    xs, y = np.asarray(x, float), np.asarray(loss, float)
    lx = np.log(xs)
    k = int(np.argmin(y))
    ends = (int(np.argmin(lx)), int(np.argmax(lx)))
    if len(np.unique(lx)) >= 3:
        c2, c1, c0 = np.polyfit(lx, y, 2)
        if c2 > 0:
            xv = -c1 / (2 * c2)
            if lx.min() <= xv <= lx.max() and k not in ends:
                return float(np.exp(xv)), float(np.polyval([c2, c1, c0], xv)), ""
    if len(np.unique(lx)) < 3:
        why = f"fewer than 3 grid values (widen {grid_key})"
    elif k in ends:
        why = f"lowest loss at the edge of the grid: widen {grid_key}"
    else:
        why = "no interior parabola minimum"
    return float(xs[k]), float(y[k]), why


def fit_power_law(runs: pd.DataFrame, what: str = "lr") -> PowerLaw:
    """``runs``: one row per tune run of one variant with N, budget, D, ``what``, loss
    (replicates are averaged). The law runs through the interior optima when there are
    ``MIN_INTERIOR`` spanning ``MIN_SPAN`` in N, else through every size's best (``basis`` says
    which); through optima of two or more budgets it is a plane in (log N, log D)."""
    rows = []
    if "D" not in runs:  # runs without their tokens: a law in N alone
        runs = runs.assign(D=np.nan)
    g = runs.groupby(["N", "budget", what], as_index=False).agg(loss=("loss", "mean"),
                                                               D=("D", "mean"))
    for (n, b), grp in g.groupby(["N", "budget"]):
        x, loss, why = grid_optimum(grp[what].to_numpy(), grp["loss"].to_numpy(), GRID_KEYS[what])
        rows.append(
            {
                "N": float(n),
                "budget": float(b),
                "D": float(grp["D"].mean()),
                f"{what}_opt": x,
                "loss_opt": loss,
                "n_grid": len(grp),
                "flagged": bool(why),
                "reason": why,
            }
        )
    sizes = pd.DataFrame(rows).sort_values("N").reset_index(drop=True)
    interior = sizes[~sizes["flagged"]]
    enough = (interior["N"].nunique() >= MIN_INTERIOR
              and interior["N"].max() >= MIN_SPAN * interior["N"].min())
    # Too few interior optima: an edge optimum still bounds x* and says which way it moves,
    # so the line goes through every size's best rather than through 2 close points.
    sizes["used"] = ~sizes["flagged"] if enough else True
    use = sizes[sizes["used"]]
    if use["N"].nunique() < 2:
        raise ValueError(
            f"tune stage: {what} optima at {use['N'].nunique()} distinct size(s); a "
            f"power law {what}*(N) needs >= 2 (raise sweep.tune_sizes)"
        )
    coef, exponent, d_exponent = _log_linear(use, what)
    return PowerLaw(what=what, coef=coef, exponent=exponent, sizes=sizes,
                    basis="interior" if enough else "all", d_exponent=d_exponent)


def _log_linear(use: pd.DataFrame, what: str) -> tuple[float, float, float]:
    """(coef, N exponent, D exponent) of log x* = log coef + p log N + q log D by least squares;
    q = 0 (a line in log N) unless the optima span two or more budgets with a spare degree of
    freedom: within one budget log D ~ log C - log N, so q is not identified there."""
    y = np.log(use[f"{what}_opt"].to_numpy(float))
    cols = [np.ones(len(use)), np.log(use["N"].to_numpy(float))]
    if use["budget"].nunique() >= 2 and len(use) >= MIN_PLANE and np.isfinite(use["D"]).all():
        cols.append(np.log(use["D"].to_numpy(float)))
    design = np.column_stack(cols)
    if np.linalg.matrix_rank(design) < design.shape[1]:
        design = design[:, :2]
    beta = np.linalg.lstsq(design, y, rcond=None)[0]
    q = float(beta[2]) if len(beta) == 3 else 0.0
    return float(np.exp(beta[0])), float(beta[1]), q


def fit_lr_law(runs: pd.DataFrame) -> PowerLaw:
    """lr*(N) over all rows of ``runs`` (one variant)."""
    return fit_power_law(runs, "lr")


def choose_beta2(runs: pd.DataFrame) -> Beta2Choice:
    """``runs``: one variant's beta2-round runs with N, budget, beta2, loss. Only sizes where
    every beta2 of the grid finished count, so each beta2 is judged on the same sizes."""
    g = runs.groupby(["N", "budget", "beta2"], as_index=False)["loss"].mean()
    wide = g.pivot_table(index=["N", "budget"], columns="beta2", values="loss").dropna()
    if wide.empty:
        raise ValueError(
            "tune stage: no size finished every beta2 of sweep.tune_beta2s; rerun "
            "the sweep to retrain the missing runs"
        )
    excess = wide.div(wide.min(axis=1), axis=0) - 1  # relative to the size's best beta2
    table = pd.DataFrame(
        {
            "beta2": [float(b) for b in excess.columns],
            "mean_rel_excess": excess.mean(axis=0).to_numpy(),
            "n_sizes": len(excess),
        }
    )
    best = float(table.loc[table["mean_rel_excess"].idxmin(), "beta2"])
    return Beta2Choice(best=best, table=table)


def per_variant(runs: pd.DataFrame, fit) -> dict:
    """``fit`` applied to each variant's rows of ``runs`` separately: {variant: result}."""
    if "variant" not in runs:
        return {"default": fit(runs)}
    return {str(v): fit(grp) for v, grp in runs.groupby("variant")}
