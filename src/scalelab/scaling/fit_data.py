"""Input handling for the scaling fits: options, column conventions and validation.

The fits work on one canonical table (see :func:`prepare_runs`) with columns
``run_id, variant, N, D, C, loss, budget, fpt`` where ``fpt = C / D`` is the training FLOPs
per token of that run (6N, or 6N + attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from scalelab.model.accounting import N_KEYS as N_COLUMNS  # N convention -> column

FLOPS_CONVENTIONS = ("attention", "6n")


class FitInputError(ValueError):
    """Bad input data for a fit (missing column, non-positive value, too few points)."""


@dataclass
class FitOptions:
    """How to read the runs and which fits to do.

    n_convention: which parameter count is N: "matmul" (non-embedding + output layer, the
        default), "total" or "non_embedding". Read from the columns n_params_matmul,
        n_params, n_params_non_embedding; a plain ``N`` column is used when the chosen one is
        absent (and a note says so).
    flops_convention: "attention" (6N + 12 L T d, the default) or "6n". Read from the
        columns ``flops`` / ``flops_6n`` (total training FLOPs of the run), or
        ``flops_per_token`` / ``flops_per_token_6n`` times D; for "attention" a ``C`` column
        is used next; otherwise C = 6 N D (with a note).
    approaches: which of Chinchilla's approaches 1, 2, 3 to run.
    n_boot, seed: bootstrap replicates (0 disables) and RNG seed.
    grid, reduction, tol, init, method: Approach 3 optimiser settings (see fit_parametric).
    boot_grid: starts of each Approach 3 bootstrap refit besides the full-data optimum:
        "small" (16 grid points, default), "coarse" (108), "full" or "none" (warm start only).
    reference_compute: C at which tokens/param and variant loss ratios are reported
        (default: the largest budget in the data).
    extrapolate: hold out the largest budget, refit, and predict its optimal loss.
    weights: "noise" (default): where every point has >= 2 seeds, Approach 2's parabolas and
        Approach 3's residuals weight each point by its measured standard error (seed spread
        and held-out error), so a noisy point pulls the fit less; "none": unweighted.
    """

    n_convention: str = "matmul"
    flops_convention: str = "attention"
    approaches: list[int] = field(default_factory=lambda: [1, 2, 3])
    n_boot: int = 100
    seed: int = 0
    grid: str = "full"
    boot_grid: str = "small"
    reduction: str = "sum"
    tol: str = "tight"
    init: str = "grid"
    method: str = "batched"
    huber_delta: float = 1e-3
    reference_compute: float | None = None
    extrapolate: bool = True
    ci: float = 0.95
    min_sizes_per_budget: int = 3
    min_points_parametric: int = 5
    weights: str = "noise"

    def __post_init__(self) -> None:
        if self.n_convention not in N_COLUMNS:
            raise ValueError(f"n_convention={self.n_convention!r} is not one of {sorted(N_COLUMNS)}")
        if self.flops_convention not in FLOPS_CONVENTIONS:
            raise ValueError(f"flops_convention={self.flops_convention!r} is not one of {FLOPS_CONVENTIONS}")
        self.approaches = sorted({int(a) for a in self.approaches})
        if not self.approaches or any(a not in (1, 2, 3) for a in self.approaches):
            raise ValueError(f"approaches={self.approaches!r}: use a subset of 1, 2, 3")
        if self.n_boot < 0:
            raise ValueError(f"n_boot={self.n_boot} must be >= 0")
        if self.boot_grid not in ("full", "coarse", "small", "none"):
            raise ValueError(f"boot_grid={self.boot_grid!r} is not one of 'full', 'coarse', 'small', 'none'")
        if self.grid not in ("full", "coarse", "small"):
            raise ValueError(f"grid={self.grid!r} is not one of 'full', 'coarse', 'small'")
        if not 0 < self.ci < 1:
            raise ValueError(f"ci={self.ci} must be in (0, 1)")
        if self.weights not in ("noise", "none"):
            raise ValueError(f"weights={self.weights!r} is not one of 'noise', 'none'")

    @property
    def noise_weighted(self) -> bool:
        return self.weights == "noise"


def measured_sigma(points: pd.DataFrame) -> np.ndarray | None:
    """Each point's ``loss_sigma`` (standard error of its mean loss), or None unless every
    point has a positive finite one: then the fits are unweighted."""
    if "loss_sigma" not in points or len(points) == 0:
        return None
    sigma = points["loss_sigma"].to_numpy(dtype=float)
    return sigma if np.all(np.isfinite(sigma) & (sigma > 0)) else None


def _where(source: str | None) -> str:
    return f" in {source}" if source else ""


def _positive(df: pd.DataFrame, col: str, source: str | None) -> None:
    vals = pd.to_numeric(df[col], errors="coerce")
    bad = ~(np.isfinite(vals) & (vals > 0))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise FitInputError(
            f"column {col!r}{_where(source)} must be a positive number in every row; "
            f"row {i} has {df[col].iloc[i]!r} ({int(bad.sum())} bad rows). Remove or fix those rows."
        )
    df[col] = vals.astype(float)


def prepare_runs(runs, options: FitOptions | None = None, source: str | None = None) -> pd.DataFrame:
    """Validate runs and return the canonical table used by every fit.

    ``runs``: DataFrame or list of dicts with, per run: ``loss`` (final validation loss in
    nats), ``D`` (training tokens), N (``N`` or n_params_matmul / n_params /
    n_params_non_embedding), optional C (``C`` / ``flops`` / ``flops_6n`` /
    ``flops_per_token`` / ``flops_per_token_6n``), optional ``budget`` (planned C of the
    IsoFLOP group), ``variant`` and ``run_id``. Notes on the conventions used are in
    ``.attrs["notes"]`` of the returned table.
    """
    opts = options or FitOptions()
    notes: list[str] = []
    df = pd.DataFrame(runs).copy() if not isinstance(runs, pd.DataFrame) else runs.copy()
    if df.empty:
        raise FitInputError(f"no runs{_where(source)}: the table is empty")
    n_src = _n_column(df, opts, source, notes)
    for col in ("D", "loss"):
        if col not in df.columns:
            raise FitInputError(f"missing column {col!r}{_where(source)}; columns present: {list(df.columns)}")
    out = pd.DataFrame(index=df.index)
    for col in (n_src, "D", "loss"):
        _positive(df, col, source)
    out["N"], out["D"], out["loss"] = df[n_src], df["D"], df["loss"]
    out["C"] = _compute_column(df, out, opts, source, notes)
    out["fpt"] = out["C"] / out["D"]
    if "budget" in df.columns:
        _positive(df, "budget", source)
        out["budget"] = df["budget"]
    else:
        out["budget"] = group_budgets(out["C"].to_numpy())
    out["variant"] = df["variant"].astype(str) if "variant" in df.columns else "default"
    out["run_id"] = df["run_id"].astype(str) if "run_id" in df.columns else [f"run{i}" for i in range(len(df))]
    # seed replicates of one point share a group id (sweep.seeds); without one every run is its
    # own point. loss_se: the held-out set's standard error of the loss, when it was measured.
    out["group_id"] = df["group_id"].astype(str) if "group_id" in df.columns else out["run_id"]
    out["loss_se"] = pd.to_numeric(df["loss_se"], errors="coerce") if "loss_se" in df.columns \
        else np.nan
    # epochs: D over the corpus's train split, when the sweep knew it (repeated data is worth less)
    out["epochs"] = pd.to_numeric(df["epochs"], errors="coerce") if "epochs" in df.columns \
        else np.nan
    out = out.reset_index(drop=True)[["run_id", "variant", "N", "D", "C", "loss", "budget", "fpt",
                                      "group_id", "loss_se", "epochs"]]
    out.attrs["notes"] = notes
    return out


def _n_column(df: pd.DataFrame, opts: FitOptions, source: str | None, notes: list[str]) -> str:
    """The column holding N under ``opts.n_convention`` (else a plain ``N``)."""
    n_col = N_COLUMNS[opts.n_convention]
    if n_col in df.columns:
        return n_col
    if "N" in df.columns:
        if any(c in df.columns for c in N_COLUMNS.values()):
            notes.append(f"column {n_col!r} absent; using 'N' as the parameter count")
        return "N"
    raise FitInputError(
        f"missing column for N{_where(source)}: need 'N' or {n_col!r} "
        f"(n_convention={opts.n_convention!r}); columns present: {list(df.columns)}"
    )


def _compute_column(df: pd.DataFrame, out: pd.DataFrame, opts: FitOptions, source: str | None,
                    notes: list[str]) -> pd.Series:
    """C under the chosen FLOPs convention (see FitOptions), from the best column present."""
    att = opts.flops_convention == "attention"
    total_col, fpt_col = ("flops", "flops_per_token") if att else ("flops_6n", "flops_per_token_6n")
    if total_col in df.columns:
        _positive(df, total_col, source)
        return df[total_col]
    if fpt_col in df.columns:
        _positive(df, fpt_col, source)
        return df[fpt_col] * out["D"]
    if att and "C" in df.columns:
        _positive(df, "C", source)
        return df["C"]
    why = "no attention FLOPs column (flops, flops_per_token or C)" if att else "6N convention"
    notes.append(f"C computed as 6*N*D ({why})")
    return 6.0 * out["N"] * out["D"]


def group_budgets(c: np.ndarray, rel_gap: float = 0.25) -> np.ndarray:
    """Group runs into IsoFLOP budgets when no ``budget`` column is given: sorted C values
    start a new group where consecutive values differ by more than ``rel_gap`` (25 %).
    Each group is labelled by its geometric-mean C."""
    c = np.asarray(c, float)
    order = np.argsort(c)
    labels = np.empty(len(c), int)
    g = 0
    for k, i in enumerate(order):
        if k and c[i] > c[order[k - 1]] * (1 + rel_gap):
            g += 1
        labels[i] = g
    out = np.empty(len(c))
    for lab in np.unique(labels):
        m = labels == lab
        out[m] = float(np.exp(np.log(c[m]).mean()))
    return out


def load_runs_csv(path: str | Path) -> pd.DataFrame:
    """Read a runs CSV (columns N, D, loss; optional C, budget, variant, run_id, ...)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"runs CSV {str(p)!r} does not exist; pass --csv FILE with columns N, D, loss")
    try:
        df = pd.read_csv(p)
    except Exception as exc:  # pandas raises several types for unreadable files
        raise FitInputError(f"cannot read CSV {str(p)!r}: {exc}") from exc
    df.columns = [str(c).strip() for c in df.columns]
    return df


def prepare_curves(curves, runs: pd.DataFrame, source: str | None = None) -> pd.DataFrame:
    """Validate loss curves (long table run_id, tokens, loss, optional flops) and join the
    run's N and variant. Missing ``flops`` are computed as tokens * the run's FLOPs/token."""
    df = pd.DataFrame(curves).copy()
    for col in ("run_id", "tokens", "loss"):
        if col not in df.columns:
            raise FitInputError(f"loss curves{_where(source)}: missing column {col!r}; columns: {list(df.columns)}")
    df["run_id"] = df["run_id"].astype(str)
    _positive(df, "tokens", source)
    _positive(df, "loss", source)
    meta = runs.set_index("run_id")[["N", "fpt", "variant"]]
    unknown = sorted(set(df["run_id"]) - set(meta.index))
    if unknown:
        raise FitInputError(f"loss curves{_where(source)}: run_id {unknown[0]!r} is not in the runs table")
    df = df.join(meta, on="run_id")
    if "flops" not in df.columns:
        df["flops"] = df["tokens"] * df["fpt"]
    else:
        _positive(df, "flops", source)
    return df[["run_id", "variant", "N", "tokens", "flops", "loss"]].reset_index(drop=True)
