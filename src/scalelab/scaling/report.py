"""Plots (PNG, matplotlib Agg) and a Markdown report for :class:`ScalingResults`.

``write_report(results, out_dir, plan=None) -> list[Path]`` returns every file written, so
the sweep can log them as MLflow artifacts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from scalelab.data.files import atomic_folder, atomic_save_with, atomic_write_text

from .fit import Estimate, ScalingResults, VariantFit
from .fit_data import measured_sigma
from .fit_holdout import fmt_error
from .laws import law_text
from .markdown import md_table
from .plot_axes import legible_log_axes
from .published_laws import CHINCHILLA, EPOCH_2024
from .report_answer import answer_md

# Published compute-optimal exponents and tokens per parameter, for the side-by-side table.
# Chinchilla: Approach 1/2 a = 0.50/0.49, b = 0.50/0.51; ~20 tokens per parameter.
PUBLISHED = {
    "Chinchilla (Hoffmann et al. 2022)": {**CHINCHILLA, "a": 0.50, "b": 0.50, "tokens_per_param": 20.0},
    "Epoch AI replication (Besiroglu et al. 2024)": {
        **EPOCH_2024,
        "a": EPOCH_2024["beta"] / (EPOCH_2024["alpha"] + EPOCH_2024["beta"]),
        "b": EPOCH_2024["alpha"] / (EPOCH_2024["alpha"] + EPOCH_2024["beta"]),
        "tokens_per_param": 20.0,
    },
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # headless; must precede pyplot import
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Lay out, write and close a figure (closing frees it: sweeps draw many)."""
    fig.tight_layout()
    atomic_save_with(path, lambda tmp: fig.savefig(tmp, dpi=120))
    _plt().close(fig)
    return path


def _suffix(results: ScalingResults, vf: VariantFit) -> str:
    if len(results.variants) == 1:
        return ""
    return "_" + "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in vf.variant)


def plot_loss_vs_tokens(vf: VariantFit, path: Path) -> Path:
    """Loss against tokens, one line per model size (curves), or final losses if no curves."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    sizes = np.sort(vf.runs["N"].unique())
    cmap = plt.get_cmap("viridis")
    color = {n: cmap(i / max(len(sizes) - 1, 1)) for i, n in enumerate(sizes)}
    if vf.curves is not None and len(vf.curves):
        for _rid, g in vf.curves.groupby("run_id"):
            g = g.sort_values("tokens")
            ax.plot(g["tokens"], g["loss"], color=color.get(g["N"].iloc[0], "k"), lw=1, alpha=0.8)
    for n in sizes:
        r = vf.runs[vf.runs["N"] == n].sort_values("D")
        ax.plot(r["D"], r["loss"], "o", color=color[n], ms=4, label=f"N={n:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("tokens D")
    ax.set_ylabel("loss (nats)")
    ax.set_title(f"Loss vs tokens per model size [{vf.variant}]")
    legible_log_axes(ax)
    if len(sizes) <= 12:
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_isoflop(vf: VariantFit, path: Path) -> Path:
    """IsoFLOP curves with fitted parabolas and their minima (flagged budgets dashed)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    cmap = plt.get_cmap("plasma")
    budgets = np.sort(vf.runs["budget"].unique())
    table = vf.approach2.budgets.set_index("budget") if vf.approach2 is not None else None
    for i, c in enumerate(budgets):
        col = cmap(i / max(len(budgets) - 1, 1) * 0.85)
        g = vf.runs[vf.runs["budget"] == c].sort_values("N")
        ax.plot(g["N"], g["loss"], "o", color=col, ms=4, label=f"C={c:.2g}")
        if table is not None and c in table.index and np.isfinite(table.loc[c, "c2"]):
            row = table.loc[c]
            x = np.linspace(np.log(g["N"].min()), np.log(g["N"].max()), 100)
            ax.plot(np.exp(x), np.polyval([row["c2"], row["c1"], row["c0"]], x), color=col,
                    ls="--" if row["flagged"] else "-", lw=1)
            if np.isfinite(row["N_opt"]) and not row["flagged"]:
                ax.plot(row["N_opt"], row["loss_opt"], "*", color=col, ms=12, mec="k")
    ax.set_xscale("log")
    ax.set_xlabel("parameters N")
    ax.set_ylabel("final loss (nats)")
    ax.set_title(f"IsoFLOP profiles [{vf.variant}] (* = minimum, dashed = flagged)")
    legible_log_axes(ax)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _band(vf: VariantFit, prefix: str, which: str, cgrid: np.ndarray, ci: float):
    """Bootstrap band of N_opt or D_opt over cgrid, or None."""
    b = vf.boot
    lo_q, hi_q = (1 - ci) / 2, 1 - (1 - ci) / 2
    if prefix == "approach3":
        cols = [f"approach3.{k}" for k in ("E", "A", "B", "alpha", "beta")]
        if b.empty or not all(c in b for c in cols):
            return None
        p = b[cols].dropna().to_numpy()
        if len(p) < 2:
            return None
        from .fit import _law

        fpt = vf.flops_per_token
        laws = [_law(dict(zip(("E", "A", "B", "alpha", "beta"), row, strict=True))) for row in p]
        ys = np.array([law.n_opt_under(cgrid, fpt) if which == "n" else law.d_opt_under(cgrid, fpt)
                       for law in laws])
    else:
        e, k = f"{prefix}.{'a' if which == 'n' else 'b'}", f"{prefix}.{which}_coef"
        if b.empty or e not in b or k not in b:
            return None
        p = b[[e, k]].dropna().to_numpy()
        if len(p) < 2:
            return None
        ys = p[:, 1:2] * cgrid[None] ** p[:, 0:1]
    ys = ys[np.all(np.isfinite(ys), axis=1)]
    if len(ys) < 2:
        return None
    return np.quantile(ys, lo_q, axis=0), np.quantile(ys, hi_q, axis=0)


def plot_frontier(vf: VariantFit, path: Path, ci: float = 0.95) -> Path:
    """N_opt(C) and D_opt(C): points, fitted lines and bootstrap confidence bands."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    c_all = vf.runs["budget"].to_numpy()
    cgrid = np.geomspace(c_all.min() / 3, c_all.max() * 3, 60)
    styles = {"approach1": ("tab:blue", "Approach 1 (envelope)"), "approach2": ("tab:orange", "Approach 2 (IsoFLOP)"),
              "approach3": ("tab:green", "Approach 3 (parametric)")}
    for which, ax in zip(("n", "d"), axes, strict=True):
        for prefix, (col, label) in styles.items():
            fit = getattr(vf, prefix)
            if fit is None:
                continue
            if prefix == "approach3":  # the data's FLOPs convention, as everywhere else
                fpt = vf.flops_per_token
                line = fit.n_opt_under(cgrid, fpt) if which == "n" else fit.d_opt_under(cgrid, fpt)
                lab = f"{label}: exp={fit.a_under(fpt) if which == 'n' else fit.b_under(fpt):.3f}"
            else:
                law = fit.n_opt if which == "n" else fit.d_opt
                line, lab = law(cgrid), f"{label}: exp={law.exponent:.3f}"
                pts = fit.points if prefix == "approach1" else fit.usable.rename(columns={"budget": "C"})
                ax.plot(pts["C"], pts["N_opt" if which == "n" else "D_opt"], "o" if prefix == "approach2" else ".",
                        color=col, ms=6 if prefix == "approach2" else 3, alpha=0.8)
            ax.plot(cgrid, line, color=col, label=lab)
            with np.errstate(all="ignore"):  # degenerate replicates give inf/nan; dropped below
                band = _band(vf, prefix, which, cgrid, ci)
            if band is not None:
                ax.fill_between(cgrid, band[0], band[1], color=col, alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("compute C (FLOPs)")
        ax.set_ylabel("N_opt (parameters)" if which == "n" else "D_opt (tokens)")
        legible_log_axes(ax, x=True, y=True)
        ax.legend(fontsize=7)
    fig.suptitle(f"Compute-optimal frontier [{vf.variant}] (bands: {ci:.0%} bootstrap)")
    return _save(fig, path)


def plot_parametric(vf: VariantFit, path: Path) -> Path:
    """Approach 3: predicted against actual loss, with the y = x line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 5))
    pred = vf.approach3.predict(vf.runs["N"], vf.runs["D"])
    sc = ax.scatter(vf.runs["loss"], pred, c=np.log10(vf.runs["budget"]), cmap="plasma", s=18)
    lo, hi = min(vf.runs["loss"].min(), pred.min()), max(vf.runs["loss"].max(), pred.max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    fig.colorbar(sc, ax=ax, label="log10 budget C")
    f = vf.approach3
    ax.set_title(f"[{vf.variant}] E={f.E:.3g} A={f.A:.3g} B={f.B:.3g}\nα={f.alpha:.3f} β={f.beta:.3f}", fontsize=9)
    ax.set_xlabel("actual loss")
    ax.set_ylabel("predicted loss L(N, D)")
    return _save(fig, path)


def estimates_table(vf: VariantFit) -> pd.DataFrame:
    """Every fitted quantity of a variant with its CI (the CLI prints this too)."""
    rows = [{"quantity": k, "value": e.value, "ci_lo": e.lo, "ci_hi": e.hi, "n_boot_ok": e.n}
            for k, e in vf.estimates.items() if not k.endswith("_coef")]
    return pd.DataFrame(rows, columns=["quantity", "value", "ci_lo", "ci_hi", "n_boot_ok"])


def _published_table(vf: VariantFit) -> pd.DataFrame:
    keys = ["E", "A", "B", "alpha", "beta", "a", "b", "tokens_per_param"]
    rows = []
    for label, prefix in (("this fit (Approach 3)", "approach3"), ("this fit (Approach 2)", "approach2"),
                          ("this fit (Approach 1)", "approach1")):
        if any(f"{prefix}.{k}" in vf.estimates for k in keys):
            rows.append({"source": label, **{k: vf.estimates.get(f"{prefix}.{k}", Estimate(float("nan")))
                                             for k in keys}})
    for label, vals in PUBLISHED.items():
        rows.append({"source": label, **{k: Estimate(float(vals.get(k, float("nan")))) for k in keys}})
    return pd.DataFrame(rows)


def _noise_md(vf: VariantFit, results: ScalingResults) -> list[str]:
    """Seed spread and held-out standard error, and which bootstrap they feed."""
    r = vf.runs
    out = ["### Noise", ""]
    se = r["loss_se"].dropna() if "loss_se" in r else pd.Series(dtype=float)
    if len(se):
        rel = (r["loss_se"] / r["loss"]).dropna()
        out.append(f"- Held-out standard error of each point's loss (one fixed token set for every "
                   f"point): median {rel.median():.3%} of the loss, max {rel.max():.3%}.")
    if vf.boot_mode == "replicates":
        sd = (r["loss_sd"] / r["loss"]).dropna()
        lo, hi = int(r["n_rep"].min()), int(r["n_rep"].max())
        out.append(f"- Seed spread: {lo if lo == hi else f'{lo}-{hi}'} seeds per "
                   f"point; the standard deviation across seeds is median {sd.median():.3%}, max "
                   f"{sd.max():.3%} of the loss. The fits use each point's mean over its seeds. "
                   "Each point's seed sd comes from a smooth model, log sd = c0 + c1 log N + "
                   "c2 log D, fitted to all points' sample sds (one point's few seeds are too "
                   f"noisy a measure of it); the {results.options.n_boot} bootstrap replicates "
                   "rebuild each point's mean from draws of the pooled seed residuals, scaled by "
                   "that sd (fixed design: the same points, their noise measured, not assumed).")
    else:
        out.append("- One seed per point: the bootstrap resamples points within each budget "
                   "(Approach 2) or over all points (Approach 3). Use sweep.seeds=K to measure "
                   "the seed noise instead.")
    out.append(_weights_line(vf, results))
    out += _repetition_lines(r)
    return [*out, ""]


def _repetition_lines(points: pd.DataFrame) -> list[str]:
    """Whether the points trained on fresh data: epochs = D / the corpus's train split."""
    ep = points["epochs"].dropna() if "epochs" in points else pd.Series(dtype=float)
    if ep.empty:
        return []
    if ep.max() <= 1.0:
        return [f"- Data: every point trains on fresh tokens (at most {ep.max():.2f} epochs of "
                "the train split)."]
    top = points[points["budget"] == points["budget"].max()]["epochs"].dropna()
    return [f"- **Data repetition:** {int((ep > 1).sum())} of {len(ep)} points train on more "
            f"tokens than the train split holds, up to {ep.max():.1f} epochs ({top.min():.1f}–"
            f"{top.max():.1f} at the largest budget). Repeated tokens are worth less than fresh "
            "ones (Muennighoff et al. 2023), so the long runs of small models lose more than they "
            "would on fresh data and N_opt(C) leans toward larger models at large budgets. A "
            "bigger corpus removes this; sweep.allow_repeat=false refuses such plans."]


def _weights_line(vf: VariantFit, results: ScalingResults) -> str:
    """How the measured noise entered the fits (FitOptions.weights)."""
    if results.options.noise_weighted and measured_sigma(vf.runs) is not None:
        return ("- Weights: each point's standard error sigma = sqrt(modelled seed sd^2 / n + held-out "
                "se^2). Approach 2's parabolas are weighted least squares (1/sigma) and its power "
                "laws weight each budget's vertex by the inverse of its standard error (delta "
                "method); Approach 3 multiplies each log residual by median(sigma/L) / (sigma/L). "
                "A noisy point pulls the fits less. The intervals cover this measured noise, not "
                "the choice of functional forms. Unweighted: `scalelab-fit --weights none`.")
    why = "weights=none" if not results.options.noise_weighted else "the noise was not measured (one seed)"
    return f"- Unweighted fits ({why}): every point counts the same."


def _power_law_md(vf: VariantFit) -> list[str]:
    """Approach 2's test of its own model: do the vertices lie on one power law?"""
    check = vf.approach2.power_law_check if vf.approach2 is not None else None
    if check is None:
        return ["**Does N_opt follow a power law?** Not tested: that needs >= 3 usable budgets and "
                "the vertices' errors (>= 2 seeds per point and noise weights).", ""]
    out = [f"**Does N_opt follow a power law?** {check.summary()}.", "",
           md_table(check.local.assign(a_ci95=1.96 * check.local["a_se"]).drop(columns="a_se")), ""]
    est = vf.estimates.get("approach2.a")
    if check.misfit and est is not None and np.isfinite(est.lo):
        half = check.scale * (est.hi - est.lo) / 2
        out += [f"The vertices bend more than their errors allow, so Approach 2's interval for a "
                f"(which assumes one power law) is too narrow: scaled by the misfit "
                f"(x{check.scale:.1f}) it is ±{half:.3f}. Over a bend, a depends on which budgets "
                "the study spans, and Approaches 2 and 3 average it differently, so they need not "
                "agree. Beyond the largest budget, the local exponent at the top of the range is "
                "the one to extrapolate with.", ""]
    return out


def _misfit_widened(vf: VariantFit) -> list[str]:
    """Approach 3's intervals scaled by its form's misfit, when the form is rejected."""
    form = vf.form
    if form is None or not form.rejected:
        return []
    parts = []
    for key, name in (("approach3.alpha", "α"), ("approach3.beta", "β"), ("approach3.a", "a")):
        est = vf.estimates.get(key)
        if est is not None and np.isfinite(est.lo):
            parts.append(f"{name} {est.value:.3f} ±{form.scale * (est.hi - est.lo) / 2:.3f}")
    if not parts:
        return []
    return [f"Scaled by the misfit (×{form.scale:.1f}, as if it were noise), Approach 3's "
            f"intervals would be: {', '.join(parts)}.", ""]


def _frontier_check_md(vf: VariantFit) -> list[str]:
    """Is the form-free predictor's own model, one power law L_opt(C), borne out?"""
    ex = vf.extrapolation
    assert ex is not None
    out, straight = [], None
    if ex.frontier_dof > 0:
        p = ex.frontier_p
        straight = p >= 0.05
        out.append(f"**Does L_opt follow one power law?** "
                   f"{'consistent' if straight else '**rejected** (p < 0.05)'}: chi2 "
                   f"{ex.frontier_chi2:.1f} on {ex.frontier_dof} dof (p = {p:.2g}) through all "
                   f"{ex.frontier_dof + 2} IsoFLOP minima, each weighted by its bootstrap spread.")
    if vf.form is not None and vf.form.rejected:
        out.append("Approach 3's form is rejected by its residuals (above), so its prediction "
                   "carries that misfit" + (
                       "; the form-free one rests only on the minima, whose power law holds."
                       if straight else "." if straight is None else
                       "; so is the form-free one's power law: neither prediction is to be trusted."))
    return [" ".join(out), ""] if out else []


def _variant_md(results: ScalingResults, vf: VariantFit, plots: dict[str, str]) -> list[str]:
    out = [f"## Variant `{vf.variant}`" if len(results.variants) > 1 else "## Fit", ""]
    for name, file in plots.items():
        out += [f"![{name}]({file})", ""]
    out += ["### Points each approach used", ""]
    out += [f"- Approach {k}: {why}" for k, why in sorted(vf.used.items())]
    out += [f"- Approach {k}: **skipped** — {why}" for k, why in sorted(vf.skipped.items())]
    out += ["", *_noise_md(vf, results)]
    out += ["### Runs", "", md_table(vf.runs.drop(columns=["variant"]).assign(
        tokens_per_param=vf.runs["D"] / vf.runs["N"])), ""]
    out += ["### Fitted parameters", "",
            f"{results.options.ci:.0%} bootstrap percentile intervals over {results.options.n_boot} "
            f"replicates; tokens per parameter and optimal loss at the reference compute "
            f"C = {results.reference_compute:.3g} FLOPs.", "", md_table(estimates_table(vf)), ""]
    out += ["### Compared with published laws", "",
            "Chinchilla's a, b are its Approaches 1-2 (≈ 0.5); its Approach 3 law implies a = 0.45. "
            "Tokens per parameter for the published laws is the usual ≈ 20 rule.", "",
            md_table(_published_table(vf)), ""]
    if vf.approach3 is not None:
        f = vf.approach3
        out += [f"Approach 3 objective {f.objective:.4g} ({f.options.get('reduction')}-reduced Huber, "
                f"δ={results.options.huber_delta}), {f.n_starts} starts, fitted in {f.seconds:.1f} s.", ""]
        if vf.form is not None:
            out += [f"**Does the form L = E + A/N^α + B/D^β describe the points?** "
                    f"{vf.form.sentence()}.", "", *_misfit_widened(vf)]
    if vf.approach2 is not None:
        t = vf.approach2.budgets
        out += ["### IsoFLOP budgets (Approach 2)", "", md_table(t[["budget", "n_sizes", "N_opt", "D_opt",
                                                                     "loss_opt", "flagged", "reason"]]), ""]
        flagged = t[t["flagged"]]
        if len(flagged):
            out += ["**Flagged and excluded:** " + "; ".join(
                f"C={r.budget:.3g} ({r.reason})" for r in flagged.itertuples()), ""]
        out += _power_law_md(vf)
    ex = vf.extrapolation
    if ex is not None:
        out += ["### Extrapolation check", "",
                f"Fitted Approach 3 on {ex.n_train_points} runs below the largest budget C = "
                f"{ex.held_out_budget:.3g} and predicted that budget's compute-optimal loss.", "",
                "| predicted loss | actual loss | actual from | relative error | N_opt predicted (A2) | N_opt actual |",
                "|---|---|---|---|---|---|",
                f"| {ex.predicted_loss:.4f} | {ex.actual_loss:.4f} | {ex.actual_source} | "
                f"{fmt_error(ex.rel_error, ex.error_ci)} | "
                f"{ex.predicted_n_opt:.4g} | {ex.actual_n_opt:.4g} |", ""]
        if ex.n_boot:
            out += [f"Intervals: {results.options.ci:.0%} over {ex.n_boot} bootstrap replicates, each "
                    "refitting both the prediction and the held-out minimum.", ""]
        if np.isfinite(ex.frontier_loss):
            out += [f"Without a form in N and D: the power law L_opt ∝ C^-{ex.frontier_gamma:.3f} "
                    f"through the smaller budgets' IsoFLOP minima predicts {ex.frontier_loss:.4f} "
                    f"({fmt_error(ex.frontier_error, ex.frontier_error_ci)}). It assumes no floor, "
                    "so near an irreducible loss "
                    "it predicts too low; while the minima still fall by the same amount per "
                    "decade, a large gap between it and Approach 3 points at Approach 3's E, "
                    "poorly fixed by losses far above it.", ""]
            out += _frontier_check_md(vf)
    if vf.skipped:
        out += ["Skipped: " + "; ".join(f"Approach {k}: {v}" for k, v in vf.skipped.items()), ""]
    return out


def _law_md(law: dict, what: str) -> str:
    """A law as markdown, e.g. lr\\*(N) = 1.2 * N^-0.479."""
    return law_text(law, what, digits=3).replace("*(", "\\*(")


def _tune_md(tune, out: Path) -> list[str]:
    """The tune stage: its plots (copied next to the report), each variant's laws and beta2,
    with the per-size optima they came from."""
    import shutil

    rounds = list(dict.fromkeys(tune.runs["round"]))
    md = ["## Hyperparameters per size (tune stage)", "",
          f"Rounds {', '.join(rounds)}, one after the other at a few sizes (Porian et al. 2024): "
          "an lr grid (parabola in log lr per size, power law lr\\*(N) over the sizes; "
          "lr\\*(N, D) with optima from two or more budgets)"
          + ("; a batch grid at lr\\*(N) with D fixed (parabola in log B, power law B\\*(N); "
             "assumes B\\* is tuned at lr\\*(N))" if "batch" in rounds else "")
          + ("; a beta2 grid at lr\\*(N) and the tuned batch (the beta2 with the lowest mean loss "
             "above each size's best)" if "beta2" in rounds else "")
          + ". What they fitted set every point of the study, per variant.", ""]
    for plot in tune.plots:
        shutil.copy(plot, out / plot.name)
        md += [f"![tune stage]({plot.name})", ""]
    for variant, t in sorted(tune.tuned.items()):
        if len(tune.tuned) > 1:
            md += [f"### {variant}", ""]
        for law in (t.lr, t.batch):
            if law is not None:
                note = f" ({law.basis_note()})" if law.basis_note() else ""
                md += [f"**{law.describe()}**{note}", "", md_table(law.sizes), ""]
        if t.beta2 is not None:
            md += [f"**beta2 = {t.beta2.best:g}**", "", md_table(t.beta2.table), ""]
    md += [f"- note: {n}" for n in tune.notes] + ([""] if tune.notes else [])
    return md


def write_report(results: ScalingResults, out_dir, plan=None, tune=None, lr_law: dict | None = None,
                 laws_from: tuple[str, dict] | None = None, forecast=None) -> list[Path]:
    """Write PNG plots and ``report.md`` into out_dir; return the written paths.

    The report opens with the answer (report_answer.py); ``plan``: optional DataFrame (or
    records) of the sweep plan, shown last.
    ``laws_from``: (path, per-variant laws) when sweep.laws_from set the hyperparameters.
    ``forecast``: the forecast stage's result (scaling/forecast_stage.py): the first section.
    """
    final = Path(out_dir).expanduser().resolve()
    # drawn into a folder beside ``final`` and renamed into place whole: a reader never sees a
    # report.md whose plots are from another fit; an earlier report there is replaced
    with atomic_folder(final, may_replace=is_report_file) as out:
        written = _write_report_into(out, results, plan, tune, lr_law, laws_from, forecast)
    return [final / p.relative_to(out) for p in written]


def is_report_file(name: str) -> bool:
    """What write_report puts in its folder (an earlier report there may be replaced)."""
    return name.endswith((".png", ".md", ".html")) or (name.startswith("forecast")
                                                        and name.endswith(".csv"))


def _write_report_into(out: Path, results: ScalingResults, plan, tune, lr_law: dict | None,
                       laws_from: tuple[str, dict] | None, forecast=None) -> list[Path]:
    written: list[Path] = []
    # the answer first (a, the forecast, the hold-out), then how: forecast, conventions, fits;
    # the plan, a wide table of inputs, last
    md = ["# Scaling-law report", "", *answer_md(results, forecast)]
    if forecast is not None:
        from .forecast_report import forecast_md

        lines, files = forecast_md(forecast, forecast.study, out, results.options.n_boot)
        md += lines
        written += files
    md += ["## Conventions", "", *_header_md(results)[2:]]
    if tune is not None:
        md += _tune_md(tune, out)
        written += [out / p.name for p in tune.plots]
    elif lr_law:
        md += ["## Hyperparameters per size", "",
               f"Every point's peak lr from the measured law {_law_md(lr_law, 'lr')} "
               "(sweep.lr_law, e.g. an earlier tune stage's law.json).",
               ""]
    elif laws_from:
        path, laws = laws_from
        md += ["## Hyperparameters per size", "",
               f"Every point's hyperparameters from an earlier tune stage (sweep.laws_from={path}):", ""]
        for variant, law in laws.items():
            parts = [_law_md(law["lr"], "lr")]
            if "batch" in law:
                parts.append(_law_md(law["batch"], "B") + " sequences")
            if "beta2" in law:
                parts.append(f"β2 = {law['beta2']:g}")
            md.append(f"- `{variant}`: " + "; ".join(parts))
        md.append("")
    for vf in results.variants.values():
        plots = _variant_plots(results, vf, out)
        written += [out / name for name in plots.values()]
        md += _variant_md(results, vf, plots)
    if results.comparison is not None:
        md += _comparison_md(results)
    if plan is not None:
        md += ["## Plan", "", md_table(pd.DataFrame(plan)), ""]
    path = out / "report.md"
    atomic_write_text(path, "\n".join(md))
    written.append(path)
    written.append(write_html(path))
    return written


def _header_md(results: ScalingResults) -> list[str]:
    """Title, the conventions, the one FLOPs convention, and the fit notes."""
    opts = results.options
    md = ["# Scaling-law report", ""]
    md += [f"N = {opts.n_convention} parameters, FLOPs = {opts.flops_convention}; "
           f"approaches {', '.join(map(str, opts.approaches))}; reference compute "
           f"C = {results.reference_compute:.3g}.", ""]
    fpts = "; ".join(f"`{v.variant}`: fpt(N) ≈ {v.flops_per_token.k:.3g} · N^{v.flops_per_token.p:.3f}"
                     for v in results.variants.values())
    md += ["**One FLOPs convention throughout.** C = fpt(N) · D, where fpt is each run's own "
           "training FLOPs per token (" + ("6N + 12·L·T·d: the matmuls, last layer included, plus "
           "attention" if opts.flops_convention == "attention" else "6N") + "), summarised as a "
           f"power law fitted to the runs ({fpts}). The budgets, Approach 2's D_opt = C / fpt(N_opt) "
           "and Approach 3's compute-optimal allocation (N_opt, D_opt, a, b, tokens per parameter, "
           "optimal loss, the hold-out check and the variants' compute multipliers) all use it; "
           "none uses 6ND unless the data do.", ""]
    md += [f"- note: {n}" for n in results.notes] + ([""] if results.notes else [])
    return md


def _variant_plots(results: ScalingResults, vf: VariantFit, out: Path) -> dict[str, str]:
    """Draw one variant's plots into ``out``: {title: file name} of those drawn."""
    sfx = _suffix(results, vf)
    plots: dict[str, str] = {}
    jobs = [("loss vs tokens", f"loss_vs_tokens{sfx}.png", plot_loss_vs_tokens, True),
            ("IsoFLOP profiles", f"isoflop{sfx}.png", plot_isoflop, True),
            ("compute-optimal frontier", f"frontier{sfx}.png",
             lambda v, p: plot_frontier(v, p, results.options.ci),
             any((vf.approach1, vf.approach2, vf.approach3))),
            ("parametric fit", f"parametric{sfx}.png", plot_parametric, vf.approach3 is not None)]
    for title, name, fn, enabled in jobs:
        if enabled:
            fn(vf, out / name)
            plots[title] = name
    return plots


def _comparison_md(results: ScalingResults) -> list[str]:
    c = results.reference_compute
    return ["## Variant comparison", "",
            f"Each variant against `{next(iter(results.variants))}`. loss_ratio = predicted compute-optimal "
            f"loss (Approach 3) at C = {c:.3g}, variant / baseline, with a "
            f"bootstrap interval; < 1 means the variant is better there. `significant`: the interval "
            f"excludes 1. `compute_multiplier` = C' / C where the baseline's compute-optimal loss "
            f"at C' equals the variant's at C = {c:.3g} (Approach 3, the "
            f"data's FLOPs convention): how much more compute the baseline needs for the "
            f"variant's loss (> 1: the variant is better), with its bootstrap interval.", "",
            md_table(results.comparison), ""]


# tables fit the page: small type, cells wrap (headers after "_"), a table with many columns in
# smaller type still, and a container that scrolls sideways should one still be too wide
HTML_STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;"
              "line-height:1.4}h1+h2+ul{background:#f3f6fb;border-left:4px solid #4a74c9;"
              "padding:.6em 1em .6em 2em}.table{max-width:100%;overflow-x:auto;margin:.5em 0}"
              "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
              "padding:2px 5px;text-align:right;vertical-align:top;overflow-wrap:break-word}"
              "th{background:#f4f4f4}table.wide{font-size:11px}.wide td,.wide th{padding:1px 3px}"
              "img{max-width:100%;height:auto}")
WIDE_TABLE = 10  # columns


def _fit_tables(body: str) -> str:
    """Each table in a scroll container, wide ones marked, a break allowed after each "_" of a
    cell (column names such as tokens_per_param are the widest words)."""
    import re

    def one(m: re.Match) -> str:
        table = re.sub(r">([^<]*)<", lambda t: ">" + t.group(1).replace("_", "_<wbr>") + "<", m.group(0))
        header = table.split("</tr>", 1)[0]
        if header.count("<th>") > WIDE_TABLE:
            table = table.replace("<table>", "<table class='wide'>", 1)
        return f"<div class='table'>{table}</div>"

    return re.sub(r"<table>.*?</table>", one, body, flags=re.S)


def write_html(md_path: Path) -> Path:
    """report.html next to report.md, every image embedded as a data URI: the MLflow artifact
    viewer renders HTML but not a Markdown file's relative images."""
    import base64
    import re

    from markdown_it import MarkdownIt  # comes with rich

    folder = md_path.parent

    def embed(m: re.Match) -> str:
        img = folder / m.group(2)
        if not img.is_file():
            return m.group(0)
        data = base64.b64encode(img.read_bytes()).decode()
        return f"![{m.group(1)}](data:image/png;base64,{data})"

    text = re.sub(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)", embed, md_path.read_text())
    body = _fit_tables(MarkdownIt("commonmark").enable("table").render(text))
    html = (f"<!doctype html><html><head><meta charset='utf-8'><title>Scaling-law report</title>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<style>{HTML_STYLE}</style></head><body>{body}</body></html>")
    out = md_path.with_suffix(".html")
    out.write_text(html)
    return out
