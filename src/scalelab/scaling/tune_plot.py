"""Plots of the tune stage: loss vs lr (tune.png), loss vs batch and vs beta2 (tune_hparams.png),
each with the per-size optima and the fitted laws, one line style per variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .plot_axes import legible_log_axes
from .tune import VariantTune

STYLES = ("-", "--", ":", "-.")


def _grid_panel(
    ax: Any, runs: pd.DataFrame, tuned: dict[str, VariantTune], what: str, cmap: Any
) -> None:
    """Loss vs ``what`` per (variant, size), with each size's optimum as a star."""
    g = runs.groupby(["variant", "N", "budget", what], as_index=False)["loss"].mean()
    keys = sorted({(n, b) for n, b in zip(g["N"], g["budget"], strict=True)})
    multi = g["variant"].nunique() > 1
    for j, variant in enumerate(sorted(g["variant"].unique())):
        law = getattr(tuned[variant], what)
        for i, (n, b) in enumerate(keys):
            s = g[(g["variant"] == variant) & (g["N"] == n) & (g["budget"] == b)].sort_values(what)
            if s.empty:
                continue
            col = cmap(i / max(len(keys) - 1, 1))
            ax.plot(
                s[what],
                s["loss"],
                "o",
                ls=STYLES[j % len(STYLES)],
                color=col,
                ms=4,
                lw=1,
                label=f"N={n:.3g} (C={b:.2g})" + (f" {variant}" if multi else ""),
            )
            r = law.sizes[(law.sizes["N"] == n) & (law.sizes["budget"] == b)] if law else []
            if len(r):
                ax.plot(r[f"{what}_opt"], r["loss_opt"], "*", color=col, ms=12, mec="k")
    ax.set_xscale("log")
    ax.set_ylabel("final loss (nats)")
    ax.legend(fontsize=7)
    legible_log_axes(ax)


def _law_curves(law: Any) -> list[tuple[np.ndarray, Any, str]]:
    """(N grid, D along it, label suffix) to draw a law: one line for a law in N; for a law in
    (N, D), one per tune budget, with D following that budget's IsoFLOP curve (a line in
    log N, log D through its sizes)."""
    ns = np.geomspace(law.sizes["N"].min() / 2, law.sizes["N"].max() * 4, 50)
    if not law.d_exponent:
        return [(ns, None, "")]
    out = []
    for budget, sub in law.sizes.groupby("budget"):
        ln, ld = np.log(sub["N"].to_numpy(float)), np.log(sub["D"].to_numpy(float))
        slope, icpt = np.polyfit(ln, ld, 1) if len(sub) > 1 else (-1.0, ld[0] + ln[0])
        out.append((ns, np.exp(icpt + slope * np.log(ns)), f" at C={budget:.3g}"))
    return out


def _law_panel(bx: Any, tuned: dict[str, VariantTune], what: str, unit: str) -> None:
    """Each variant's per-size optima and its fitted power law."""
    sym = {"lr": "lr", "batch": "B"}[what]
    for j, (variant, t) in enumerate(sorted(tuned.items())):
        law = getattr(t, what)
        if law is None:
            continue
        tag = f" {variant}" if len(tuned) > 1 else ""
        ok, bad = law.sizes[~law.sizes["flagged"]], law.sizes[law.sizes["flagged"]]
        bx.plot(ok["N"], ok[f"{what}_opt"], "o", color=f"C{j}", label=f"optimum{tag}")
        if len(bad):
            bx.plot(bad["N"], bad[f"{what}_opt"], "x", color=f"C{j}", label=f"flagged{tag}")
        for k, (ns, ds, where) in enumerate(_law_curves(law)):
            bx.plot(
                ns,
                law(ns, ds),
                color=f"C{j}",
                ls=STYLES[(j + k) % len(STYLES)],
                label=law.describe().replace(" sequences", "") + where + tag,
            )
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xlabel("parameters N (matmul)")
    bx.set_ylabel(f"{sym}* ({unit})")
    bx.set_title(f"fitted {sym}* (optima of every tune budget)")
    bx.legend(fontsize=7)
    legible_log_axes(bx, x=True, y=True)


def plot_tune(runs: pd.DataFrame, tuned: dict[str, VariantTune], path: Path) -> Path:
    """The lr round: loss vs lr per size (with each size's optimum) and the fitted lr*(N)."""
    from .report import _plt, _save

    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    _grid_panel(ax, runs, tuned, "lr", plt.get_cmap("viridis"))
    ax.set_xlabel("peak learning rate")
    ax.set_title("tune stage: loss vs lr per size (* = optimum)")
    _law_panel(bx, tuned, "lr", "peak lr")
    return _save(fig, path)


def plot_hparams(runs: pd.DataFrame, tuned: dict[str, VariantTune], path: Path) -> Path:
    """The batch and beta2 rounds: loss vs batch per size and the fitted B*(N); loss vs beta2
    per size with the chosen beta2. ``runs``: the rounds' runs with a ``round`` column."""
    from .report import _plt, _save

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.5))  # at most ~1.3x shrunk to a report page
    cmap = plt.get_cmap("viridis")
    batch, beta2 = runs[runs["round"] == "batch"], runs[runs["round"] == "beta2"]
    if not batch.empty:
        _grid_panel(axes[0], batch, tuned, "batch", cmap)
        axes[0].set_xlabel("global batch (sequences)")
        axes[0].set_title("loss vs batch per size at lr*(N) (* = optimum)")
        _law_panel(axes[1], tuned, "batch", "sequences")
    if not beta2.empty:
        cx = axes[2]
        g = beta2.groupby(["variant", "N", "beta2"], as_index=False)["loss"].mean()
        for j, ((variant, n), s) in enumerate(g.groupby(["variant", "N"])):
            cx.plot(
                1 - s["beta2"],
                s["loss"],
                "o",
                ls=STYLES[j % len(STYLES)],
                label=f"N={n:.3g}" + (f" {variant}" if len(tuned) > 1 else ""),
            )
        for t in tuned.values():
            if t.beta2 is not None:
                cx.axvline(1 - t.beta2.best, color="k", lw=0.8, ls=":")
        cx.set_xscale("log")
        cx.set_xlabel("1 - beta2 (dotted: chosen)")
        cx.set_ylabel("final loss (nats)")
        cx.set_title("loss vs beta2 per size at lr*(N), B*(N)")
        cx.legend(fontsize=7)
        legible_log_axes(cx)
    return _save(fig, path)
