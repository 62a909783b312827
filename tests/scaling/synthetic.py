"""Synthetic scaling data from a known law, to check the fitters against the truth."""

from __future__ import annotations

import math

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


# A small study's law: L = E + A/N^alpha + B/D^beta at ~1e3-1e6 parameters, with the
# curvature and the D/N ~ 50 optimum of scalelab's CPU studies.
SMALL_LAW = {"E": 1.2, "A": 30.0, "B": 60.0, "alpha": 0.40, "beta": 0.33}


def family_shape(n: float, seq_len: int = 64, vocab: int = 101) -> dict[str, float]:
    """A continuous stand-in for a sweep family's shape of ~n matmul parameters: the counts
    the forecast reads (total, non-embedding, matmul N, exact FLOPs per token)."""
    layers = 2 if n < 3e4 else 4
    d = math.sqrt(n / (12 * layers))
    return {"n_params": n + vocab * d + seq_len * d, "n_params_non_embedding": n + 4 * layers * d,
            "n_params_matmul": float(n), "flops_per_token": 6 * n + 12 * layers * seq_len * d}


def study_runs(budgets=(4e9, 1e10, 2.5e10, 6.3e10, 1.6e11), sizes: int = 7, span: float = 16.0,
               seeds: int = 3, noise: float = 0.005, law: dict[str, float] = SMALL_LAW,
               seed: int = 0) -> pd.DataFrame:
    """A study's runs.csv rows: per budget, ``sizes`` sizes over ``span`` around the law's
    optimum, D = C / FLOPs per token, ``seeds`` replicates with relative noise ``noise``."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in budgets:
        centre = true_optimum(c, law)[0]
        for i, n in enumerate(np.geomspace(centre / math.sqrt(span), centre * math.sqrt(span), sizes)):
            shape = family_shape(float(n))
            d = c / shape["flops_per_token"]
            for r in range(seeds):
                loss = float(law_loss(n, d, law)) * (1 + noise * rng.standard_normal())
                rows.append(shape | {"budget": c, "D": d, "loss": loss, "replicate": r,
                                     "group_id": f"c{c:.2e}_n{i}", "stage": "main"})
    return pd.DataFrame(rows)


def true_optimum(c: float, law: dict[str, float] = SMALL_LAW) -> tuple[float, float]:
    """(N*, L*) of the law at exact compute c over family_shape's FLOPs per token."""
    grid = np.geomspace(10, 1e9, 20_000)
    fpt = np.array([family_shape(n)["flops_per_token"] for n in grid])
    loss = law_loss(grid, c / fpt, law)
    k = int(np.argmin(loss))
    return float(grid[k]), float(loss[k])
