"""Which noise control changed a study's precision most? Refit one sweep's runs.csv with one
factor taken away at a time and print the 95 % CI half-widths the issue's targets are about.

    python scripts/scaling_ablation.py sweeps/cpu_medium/runs.csv \
        [--untuned sweeps/cpu_medium_untuned/runs.csv] [--n-boot 200]

Rows: the full study; fewer seeds (when the sweep has replicates); the same sweep without its
tune stage (tuning cannot be taken away from finished runs, so --untuned reads a sweep run with
sweep.tune_lr_factors=[] sweep.tune_batch_factors=[] sweep.tune_beta2s=[]); the in-training
validation loss instead of the fixed held-out set (eval size); every other budget (budgets);
the same runs fitted without the noise weights (weights). With one seed nothing is weighted.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from scalelab.scaling.fit import fit_available
from scalelab.scaling.fit_data import FitOptions
from scalelab.scaling.fit_holdout import fmt_error


def summary(runs: pd.DataFrame, n_boot: int, weights: str = "noise") -> dict[str, str]:
    res, _ = fit_available(runs, None, FitOptions(n_boot=n_boot, approaches=[2, 3], weights=weights))
    if res is None:
        return {"a (A2)": "no fit"}
    vf = next(iter(res.variants.values()))
    out = {}
    for label, key in (("a (A2)", "approach2.a"), ("a (A3)", "approach3.a"),
                       ("alpha (A3)", "approach3.alpha"), ("beta (A3)", "approach3.beta")):
        e = vf.estimates.get(key)
        out[label] = "—" if e is None else f"{e.value:.3f}" + (
            "" if np.isnan(e.lo) else f" ±{(e.hi - e.lo) / 2:.3f}")
    ex = vf.extrapolation
    out["hold-out error"] = "—" if ex is None else fmt_error(ex.rel_error, ex.error_ci)
    out["form-free hold-out"] = "—" if ex is None else fmt_error(ex.frontier_error, ex.frontier_error_ci)
    form = vf.form  # Approach 3's misfit against the points' noise (scaling/form_check.py)
    out["A3 rms / noise"] = "—" if form is None else (
        f"{form.rms:.2%} / {form.noise:.2%}" if form.measured else f"{form.rms:.2%} / —")
    out["points"] = str(len(vf.runs))
    return out


UNWEIGHTED = "weights: none (every point counts the same)"


def cases_of(runs: pd.DataFrame, untuned: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """The full study and one control taken away per row, each with all the seeds it has."""
    cases = {"full study": runs}
    k = runs["replicate"].nunique() if "replicate" in runs else 1
    if k > 1:
        # only budgets whose every point has all its seeds (a seed pass may be partial)
        full = runs.groupby("budget")["group_id"].agg(lambda g: g.value_counts().min() == k
                                                      and g.nunique() * k == len(g))
        runs = runs[runs["budget"].isin(full[full].index)]
        cases = {f"full study ({k} seeds)": runs, UNWEIGHTED: runs}
        for j in range(1, k):
            cases[f"seeds: {j} instead of {k}"] = runs[runs["replicate"] < j]
    if untuned is not None:
        k_u = untuned["replicate"].nunique() if "replicate" in untuned else 1
        cases[f"tuning: none (untuned sweep, {k_u} seed{'s' if k_u > 1 else ''})"] = untuned
    if "val_loss" in runs and runs["val_loss"].notna().all():
        cases["eval: in-training val loss (4k tokens)"] = runs.assign(loss=runs["val_loss"],
                                                                     loss_se=np.nan)
    budgets = np.sort(runs["budget"].unique())
    if len(budgets) >= 5:
        cases["budgets: every other one"] = runs[runs["budget"].isin(budgets[::2])]
    return cases


def _main_runs(path: str) -> pd.DataFrame:
    runs = pd.read_csv(path)
    return runs[runs["stage"] == "main"] if "stage" in runs else runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_csv")
    ap.add_argument("--untuned", help="runs.csv of the same sweep run without its tune stage")
    ap.add_argument("--n-boot", type=int, default=200)
    args = ap.parse_args()
    untuned = _main_runs(args.untuned) if args.untuned else None
    cases = cases_of(_main_runs(args.runs_csv), untuned)
    rows = [{"case": name, **summary(df, args.n_boot, "none" if name == UNWEIGHTED else "noise")}
            for name, df in cases.items()]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "—")) for c in cols) + " |")


if __name__ == "__main__":
    main()
