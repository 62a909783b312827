"""scalelab-fit: fit scaling laws to a CSV of runs or to a sweep's MLflow runs, print the
fitted values with bootstrap CIs and write the report.

    scalelab-fit --csv runs.csv [--curves curves.csv] --out reports/my_fit
    scalelab-fit --sweep cpu_small            # or --parent-run-id <MLflow run id>

Every approach the data allow is fitted; one that cannot be (too few budgets, no interior
minimum, no real end points for Approach 1) is named with the reason. Exit status: 0 when at
least one approach was fitted, 2 on bad input (missing column, non-positive value, missing
file) or when none could be.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalelab.model.accounting import N_CONVENTIONS

# Contract of scalelab.scaling.collect (MLflow lives there, not here):
#   collect_runs(sweep, parent_run_id, tracking_uri, n_convention, flops_convention) -> (runs, curves)
COLLECT_FN = "collect_runs"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scalelab-fit", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--csv", type=Path, help="runs CSV with columns N, D, loss (optional C, budget, variant, run_id)")
    src.add_argument("--sweep", help="sweep name: read its child runs from MLflow")
    src.add_argument("--parent-run-id", help="MLflow parent run id of a sweep")
    p.add_argument("--curves", type=Path, help="loss-curves CSV (run_id, tokens, loss, optional flops) for Approach 1")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (with --sweep/--parent-run-id)")
    p.add_argument("--out", type=Path, help="report directory (default: <project root>/reports/fit_<name>)")
    p.add_argument("--approaches", default="1,2,3", help="comma-separated subset of 1,2,3")
    p.add_argument("--n-boot", type=int, default=100, help="bootstrap replicates (0: no intervals)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-convention", default="matmul", choices=list(N_CONVENTIONS))
    p.add_argument("--flops-convention", default="attention", choices=["attention", "6n"])
    p.add_argument("--grid", default="full", choices=["full", "coarse"],
                   help="Approach 3 start grid: full = Hoffmann's 4500 points")
    p.add_argument("--reference-compute", type=float, help="C for tokens/param and variant ratios (default: max budget)")
    p.add_argument("--weights", default="noise", choices=["noise", "none"],
                   help="weight points by their measured noise (seed spread, held-out error) or not")
    p.add_argument("--no-extrapolate", action="store_true", help="skip the hold-out-largest-budget check")
    p.add_argument("--no-report", action="store_true", help="print the fit only; write no files")
    p.add_argument("--keep-duplicates", action="store_true",
                   help="count identical CSV rows as separate runs (default: merge them, with a warning)")
    return p


def _load(args) -> tuple[object, object, str]:
    from scalelab.scaling import load_runs_csv

    if args.csv is not None:
        runs = _merged_duplicates(load_runs_csv(args.csv), args.csv, args.keep_duplicates)
        curves = load_runs_csv(args.curves) if args.curves is not None else None
        return runs, curves, str(args.csv)
    try:
        from scalelab.scaling import collect  # lazy: needs mlflow
    except ImportError as exc:
        raise RuntimeError(
            "reading a sweep from MLflow needs scalelab.scaling.collect, which is not available "
            f"({exc}); export the runs to CSV and use --csv FILE instead"
        ) from exc
    fn = getattr(collect, COLLECT_FN, None)
    if fn is None:
        raise RuntimeError(f"scalelab.scaling.collect has no {COLLECT_FN}(); use --csv FILE instead")
    runs, curves = fn(sweep=args.sweep, parent_run_id=args.parent_run_id, tracking_uri=args.tracking_uri,
                      n_convention=args.n_convention, flops_convention=args.flops_convention)
    return runs, curves, f"sweep {args.sweep or args.parent_run_id}"


def _merged_duplicates(runs, path: Path, keep: bool):
    """``runs`` with identical rows merged: a row pasted twice is one run, not two points
    (which would narrow every interval). ``keep``: count them anyway, as asked."""
    dup = int(runs.duplicated().sum())
    if dup and not keep:
        print(f"scalelab-fit: warning: {dup} duplicated row(s) in {path} merged (each counts once; "
              "--keep-duplicates counts every copy)", file=sys.stderr)
        return runs.drop_duplicates().reset_index(drop=True)
    return runs


def print_results(results) -> None:
    """A rich table of every fitted quantity with its CI, per variant."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from scalelab.scaling.fit_holdout import fmt_error
    from scalelab.scaling.report import estimates_table

    console = Console()
    for note in results.notes:
        console.print(f"[yellow]note:[/] {note}")
    ci = f"{results.options.ci:.0%} CI"
    for vf in results.variants.values():
        t = Table(title=escape(f"scaling fit [{vf.variant}]")+f" — {len(vf.runs)} runs, reference C = {results.reference_compute:.3g}")
        for col in ("quantity", "value", ci, "boot ok"):
            t.add_column(col, justify="left" if col == "quantity" else "right")
        for r in estimates_table(vf).itertuples(index=False):
            interval = "" if r.ci_lo != r.ci_lo else f"[{r.ci_lo:.4g}, {r.ci_hi:.4g}]"
            t.add_row(r.quantity, f"{r.value:.4g}", interval, str(r.n_boot_ok))
        console.print(t)
        if vf.approach2 is not None:
            for r in vf.approach2.budgets[vf.approach2.budgets["flagged"]].itertuples():
                console.print(f"[yellow]flagged budget[/] C={r.budget:.3g}: {r.reason} (excluded from Approach 2)")
        check = vf.approach2.power_law_check if vf.approach2 is not None else None
        if check is not None:
            console.print(("[yellow]Approach 2:[/] " if check.misfit else "Approach 2: ") + check.summary())
        if vf.form is not None:
            console.print(("[yellow]Approach 3:[/] " if vf.form.rejected else "Approach 3: ")
                          + escape(vf.form.sentence()))
        for k, why in vf.skipped.items():
            console.print(f"[yellow]Approach {k} skipped:[/] {why}")
        ex = vf.extrapolation
        if ex is not None:
            console.print(f"extrapolation to C={ex.held_out_budget:.3g}: predicted {ex.predicted_loss:.4f}, "
                          f"actual {ex.actual_loss:.4f} ({ex.actual_source}), error "
                          f"{fmt_error(ex.rel_error, ex.error_ci)}"
                          + (f"; L_opt ∝ C^-{ex.frontier_gamma:.3f} through the other minima: "
                             f"{fmt_error(ex.frontier_error, ex.frontier_error_ci)}"
                             if ex.frontier_loss == ex.frontier_loss else ""))
    if results.comparison is not None:
        for r in results.comparison.to_dict("records"):
            if "loss_ratio" in r:
                console.print(f"variant {r['variant']} / {r['baseline']}: optimal-loss ratio at "
                              f"C={results.reference_compute:.3g} = {r['loss_ratio'].fmt(4)} → better: {r['better']}"
                              f"{'' if r['significant'] else ' (not significant)'}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from scalelab.scaling import FitInputError, FitOptions, write_report
    from scalelab.scaling.fit import fit_available

    try:
        approaches = tuple(int(a) for a in args.approaches.split(",") if a.strip())
        opts = FitOptions(n_convention=args.n_convention, flops_convention=args.flops_convention,
                          approaches=approaches, n_boot=args.n_boot, seed=args.seed, grid=args.grid,
                          reference_compute=args.reference_compute, extrapolate=not args.no_extrapolate,
                          weights=args.weights)
        runs, curves, source = _load(args)
        # fit what the data allow; an approach that cannot be fitted is named with the reason
        results, notes = fit_available(runs, curves, opts, source=source)
        if results is None:
            raise FitInputError("no approach could be fitted: " + " | ".join(notes))
    except (FitInputError, FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"scalelab-fit: error: {exc}", file=sys.stderr)
        return 2
    print_results(results)  # its notes name every approach left out and why
    if not args.no_report:
        name = args.csv.stem if args.csv is not None else (args.sweep or args.parent_run_id)
        from scalelab.paths import repo_root

        out = args.out or repo_root() / "reports" / f"fit_{name}"  # never relative to the cwd
        files = write_report(results, out)
        print(f"report: {out / 'report.md'} ({len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
