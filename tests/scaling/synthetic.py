"""Synthetic scaling data from a known law, to check the fitters against the truth."""

from __future__ import annotations

import numpy as np
import pandas as pd

from scalelab.scaling.published_laws import CHINCHILLA, law_loss, law_n_opt


def isoflop_runs(
    budgets=(1e17, 1e18, 1e19, 1e20, 1e21),
    sizes_per_budget: int = 9,
    span: float = 1.0,
    noise: float = 0.005,
    seed: int = 0,
    law: dict[str, float] = CHINCHILLA,
    variant: str | None = None,
    center_shift: float = 0.0,
) -> pd.DataFrame:
    """IsoFLOP grid: per budget, sizes evenly spaced in log10 N over ±span decades around
    the true optimum (shifted by ``center_shift`` decades); D = C / (6N); loss from the law
    times (1 + noise * standard normal)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in budgets:
        center = np.log10(law_n_opt(c, law)) + center_shift
        for i, log_n in enumerate(np.linspace(center - span, center + span, sizes_per_budget)):
            n = 10.0**log_n
            d = c / (6 * n)
            loss = float(law_loss(n, d, law)) * (1 + noise * rng.standard_normal())
            rows.append({"run_id": f"c{c:.0e}_n{i}", "N": n, "D": d, "C": c, "budget": c, "loss": loss})
    df = pd.DataFrame(rows)
    if variant is not None:
        df["variant"] = variant
        df["run_id"] = variant + "_" + df["run_id"]
    return df


def loss_curves(runs: pd.DataFrame, points_per_run: int = 40, law: dict[str, float] = CHINCHILLA,
                noise: float = 0.0, seed: int = 0, start_fraction: float = 0.02) -> pd.DataFrame:
    """Loss curves (run_id, tokens, flops, loss) as if each intermediate point were a run
    trained to that many tokens (the idealisation behind Chinchilla's Approach 1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in runs.itertuples():
        tokens = np.geomspace(start_fraction * r.D, r.D, points_per_run)
        loss = law_loss(r.N, tokens, law) * (1 + noise * rng.standard_normal(points_per_run))
        flops = tokens * (r.C / r.D)
        rows.append(pd.DataFrame({"run_id": r.run_id, "tokens": tokens, "flops": flops, "loss": loss}))
    return pd.concat(rows, ignore_index=True)


def with_endpoints(runs: pd.DataFrame, fractions=(0.25, 0.5), law: dict[str, float] = CHINCHILLA,
                   noise: float = 0.0, seed: int = 1) -> pd.DataFrame:
    """The runs plus, for each, runs of the same N trained to ``fractions`` of its D (what WSD
    cooldown branches give): real end points for Approach 1. A branch's budget is its own C."""
    rng = np.random.default_rng(seed)
    extra = []
    for q in fractions:
        b = runs.copy()
        b["D"], b["C"], b["budget"] = runs["D"] * q, runs["C"] * q, runs["budget"] * q
        b["loss"] = law_loss(b["N"], b["D"], law) * (1 + noise * rng.standard_normal(len(b)))
        b["run_id"] = runs["run_id"] + f"_q{q:g}"
        extra.append(b)
    return pd.concat([runs, *extra], ignore_index=True)


def replicate(runs: pd.DataFrame, k: int, noise: float, seed: int = 2,
              law: dict[str, float] = CHINCHILLA) -> pd.DataFrame:
    """``k`` seed replicates of every run (one group_id per point), each loss from the law times
    (1 + noise * standard normal): the seeds' spread is the only noise."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(k):
        b = runs.copy()
        b["group_id"] = runs["run_id"]
        b["run_id"] = runs["run_id"] + f"_s{r}"
        b["loss"] = law_loss(b["N"], b["D"], law) * (1 + noise * rng.standard_normal(len(b)))
        out.append(b)
    return pd.concat(out, ignore_index=True)
