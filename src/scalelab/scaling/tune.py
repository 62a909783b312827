"""The tune stage: per-size learning rates as a power law, as Porian et al. (2024) do.

At a few sizes of the ``sweep.tune_budgets`` IsoFLOP curves (the points themselves: same N,
D, schedule), each run of an lr grid (``sweep.tune_lr_factors`` x the rule's lr) is trained.
Per size, a parabola in log lr through the final losses gives lr*(N) (the grid's best lr when
the parabola has no interior minimum, flagged). A least-squares line in log-log space over
the sizes gives lr*(N) = coef * N^exponent, which then sets every point's lr
(:meth:`Plan.with_lr_law`). Pure numpy/pandas: the caller trains, collects and logs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .plan import Plan


def tune_plan(plan: Plan) -> Plan:
    """The lr-grid runs: ``tune_sizes`` sizes (smallest .. largest, evenly by index) of each
    tune budget's curve, each at every lr factor. Stage "tune", never replicated."""
    spec = plan.spec
    budgets = spec.tune_budgets or [min(p.budget for p in plan.points)]
    base = [p for p in plan.points if p.replicate == 0 and p.branch_of is None]
    out = []
    for b in budgets:
        for variant in plan.variants:
            curve = sorted((p for p in base if p.budget == b and p.variant == variant),
                           key=lambda p: p.n_params_matmul)
            k = min(spec.tune_sizes, len(curve))
            picks = sorted({round(i * (len(curve) - 1) / max(k - 1, 1)) for i in range(k)})
            for i in picks:
                for f in spec.tune_lr_factors:
                    out.append(dataclasses.replace(
                        curve[i], stage="tune", lr=curve[i].lr * f, lr_factor=f,
                        save_at_steps=[], schedule="cosine", decay_fraction=None))
    tp = dataclasses.replace(plan, points=out,
                             spec=dataclasses.replace(spec, wsd=False, seeds=1))
    tp.finalize()
    return tp


@dataclass
class LrLaw:
    """lr*(N) = coef * N^exponent, and the per-size optima it was fitted to."""

    coef: float
    exponent: float
    sizes: pd.DataFrame  # N, budget, lr_opt, loss_opt, flagged, reason

    def __call__(self, n) -> np.ndarray:
        return self.coef * np.asarray(n, float) ** self.exponent

    def as_dict(self) -> dict:
        return {"coef": self.coef, "exponent": self.exponent,
                "sizes": self.sizes.to_dict("records")}


def size_optimum(lr: np.ndarray, loss: np.ndarray) -> tuple[float, float, str]:
    """(lr*, loss at lr*, flag reason or "") from a parabola in log lr."""
    x, y = np.log(np.asarray(lr, float)), np.asarray(loss, float)
    k = int(np.argmin(y))
    if len(np.unique(x)) >= 3:
        c2, c1, c0 = np.polyfit(x, y, 2)
        if c2 > 0:
            xv = -c1 / (2 * c2)
            if x.min() <= xv <= x.max() and k not in (int(np.argmin(x)), int(np.argmax(x))):
                return float(np.exp(xv)), float(np.polyval([c2, c1, c0], xv)), ""
    edge = "lowest loss at the edge of the lr grid: widen sweep.tune_lr_factors"
    return float(np.exp(x[k])), float(y[k]), edge if k in (int(np.argmin(x)), int(np.argmax(x))) \
        else "no interior parabola minimum"


def fit_lr_law(runs: pd.DataFrame) -> LrLaw:
    """``runs``: one row per tune run with N, budget, lr, loss (replicates are averaged)."""
    rows = []
    g = runs.groupby(["N", "budget", "lr"], as_index=False)["loss"].mean()
    for (n, b), grp in g.groupby(["N", "budget"]):
        lr, loss, why = size_optimum(grp["lr"].to_numpy(), grp["loss"].to_numpy())
        rows.append({"N": float(n), "budget": float(b), "lr_opt": lr, "loss_opt": loss,
                     "n_lrs": len(grp), "flagged": bool(why), "reason": why})
    sizes = pd.DataFrame(rows).sort_values("N").reset_index(drop=True)
    use = sizes[~sizes["flagged"]]
    if use["N"].nunique() < 2:  # edge optima still say which way lr must move
        use = sizes
    if use["N"].nunique() < 2:
        raise ValueError(f"tune stage: lr optima at {use['N'].nunique()} distinct size(s); a "
                         "power law lr*(N) needs >= 2 (raise sweep.tune_sizes)")
    slope, icpt = np.polyfit(np.log(use["N"]), np.log(use["lr_opt"]), 1)
    return LrLaw(coef=float(np.exp(icpt)), exponent=float(slope), sizes=sizes)


def plot_tune(runs: pd.DataFrame, law: LrLaw, path: Path) -> Path:
    """Loss vs lr per size (with each size's optimum) and the fitted lr*(N)."""
    from .report import _plt, _save

    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    g = runs.groupby(["N", "budget", "lr"], as_index=False)["loss"].mean()
    cmap = plt.get_cmap("viridis")
    keys = sorted({(n, b) for n, b in zip(g["N"], g["budget"], strict=True)})
    for i, (n, b) in enumerate(keys):
        col = cmap(i / max(len(keys) - 1, 1))
        s = g[(g["N"] == n) & (g["budget"] == b)].sort_values("lr")
        ax.plot(s["lr"], s["loss"], "o-", color=col, ms=4, lw=1, label=f"N={n:.3g} (C={b:.2g})")
        r = law.sizes[(law.sizes["N"] == n) & (law.sizes["budget"] == b)]
        if len(r):
            ax.plot(r["lr_opt"], r["loss_opt"], "*", color=col, ms=12, mec="k")
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final loss (nats)")
    ax.set_title("tune stage: loss vs lr per size (* = optimum)")
    ax.legend(fontsize=7)
    ok = law.sizes[~law.sizes["flagged"]]
    bad = law.sizes[law.sizes["flagged"]]
    bx.plot(ok["N"], ok["lr_opt"], "o", color="tab:blue", label="optimum")
    if len(bad):
        bx.plot(bad["N"], bad["lr_opt"], "x", color="tab:red", label="edge of grid (flagged)")
    ns = np.geomspace(law.sizes["N"].min() / 2, law.sizes["N"].max() * 4, 50)
    bx.plot(ns, law(ns), "k-", label=f"lr* = {law.coef:.3g} N^{law.exponent:.3f}")
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xlabel("parameters N (matmul)")
    bx.set_ylabel("lr*")
    bx.set_title("fitted lr*(N)")
    bx.legend(fontsize=7)
    return _save(fig, path)
