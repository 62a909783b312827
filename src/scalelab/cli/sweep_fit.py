"""`scalelab-sweep`'s fit step: every approach the runs allow, the report, and the summary lines
and metrics logged to the parent run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fit_and_report(collected: Any, plan: Any, settings: Any, sweep_dir: Path, parent: Any,
                   console: Any, tuned: Any = None, forecast: Any = None) -> list[str]:
    """Fit (approaches 1-3 as the data allows), write the report, log both to the parent."""
    import pandas as pd

    from scalelab.cli.fit import print_results
    from scalelab.scaling.fit import fit_available
    from scalelab.scaling.fit_data import FitOptions
    from scalelab.scaling.report import write_report

    console.print(f"fitting {len(collected.runs)} runs ({settings.bootstrap} bootstrap resamples)")
    options = FitOptions(n_convention=plan.spec.n_convention,
                         flops_convention=settings.flops_convention, n_boot=settings.bootstrap)
    results, notes = fit_available(collected.runs, collected.curves, options,
                                   source=f"sweep {settings.name}")
    lines = [f"[yellow]note:[/yellow] {n}" for n in notes]
    if results is None:
        return [*lines, "[red]no scaling law could be fitted to these runs[/red]"]
    print_results(results)
    report_dir = sweep_dir / "report"
    files = write_report(results, report_dir, plan=pd.DataFrame(plan.rows()), tune=tuned, lr_law=plan.lr_law,
                         forecast=forecast,
                         laws_from=(plan.spec.laws_from, plan.tuned)
                         if plan.spec.laws_from and plan.tuned and tuned is None else None)
    parent.log_artifacts(report_dir, "report")
    metrics = {}
    for name, vf in results.variants.items():
        prefix = "" if len(results.variants) == 1 else f"{name}/"
        for key, est in vf.estimates.items():
            metrics[f"fit/{prefix}{key}"] = est.value
        ex = vf.extrapolation
        tag = f" [{name}]" if len(results.variants) > 1 else ""
        e = vf.estimates
        for label, keys in (("Approach 1", ("approach1.a", "approach1.b")),
                            ("Approach 2", ("approach2.a", "approach2.b"))):
            if keys[0] in e:
                lines.append(f"{label}{tag}: N_opt ∝ C^a, a = {e[keys[0]].fmt()}; "
                             f"D_opt ∝ C^b, b = {e[keys[1]].fmt()}")
        if "approach3.alpha" in e:
            lines.append(f"Approach 3{tag}: L = E + A/N^α + B/D^β: α = {e['approach3.alpha'].fmt()}, "
                         f"β = {e['approach3.beta'].fmt()}, E = {e['approach3.E'].fmt()}"
                         if "approach3.E" in e else
                         f"Approach 3{tag}: α = {e['approach3.alpha'].fmt()}, "
                         f"β = {e['approach3.beta'].fmt()}")
        if vf.form is not None:
            lines.append(form_line(vf.form, tag, prefix, metrics))
        for k in ("approach2.tokens_per_param", "approach3.tokens_per_param",
                  "approach1.tokens_per_param"):
            if k in e:
                lines.append(f"compute-optimal tokens/param{tag} at C={results.reference_compute:.3g}"
                             f" ({k.split('.')[0]}): {e[k].fmt()}")
                break
        lines.append(extrapolation_line(ex, tag, prefix, metrics))
    parent.log_metrics({k: v for k, v in metrics.items() if v == v})
    if forecast is not None:
        from scalelab.scaling.forecast_stage import summary_lines

        lines += summary_lines(forecast)
    lines.append(f"report       : {report_dir / 'report.md'} ({len(files)} files)")
    return lines



def extrapolation_line(ex: Any, tag: str, prefix: str, metrics: dict[str, float]) -> str:
    """The hold-out check's summary line; its errors go into ``metrics``."""
    if ex is None:
        return f"extrapolation{tag}: needs >= 3 budgets (and >= 5 runs below the largest)"
    from scalelab.scaling.fit_holdout import fmt_error

    for name, err, ci in (("extrapolation_rel_error", ex.rel_error, ex.error_ci),
                          ("extrapolation_frontier_rel_error", ex.frontier_error, ex.frontier_error_ci)):
        metrics[f"fit/{prefix}{name}"] = err
        if ci[0] == ci[0]:  # not nan: the bootstrap ran
            metrics[f"fit/{prefix}{name}_lo"], metrics[f"fit/{prefix}{name}_hi"] = ci
    check = ""
    if ex.frontier_dof > 0:  # is that power law itself borne out by all the minima?
        metrics[f"fit/{prefix}frontier_power_law_p"] = ex.frontier_p
        check = f" (one power law through all the minima: p = {ex.frontier_p:.2g})"
    return (f"extrapolation{tag}: fit without C={ex.held_out_budget:.3g} predicts "
            f"{ex.predicted_loss:.4f}, actual {ex.actual_loss:.4f} ({ex.actual_source}): error "
            f"{fmt_error(ex.rel_error, ex.error_ci)}; the power law through the other IsoFLOP "
            f"minima: {fmt_error(ex.frontier_error, ex.frontier_error_ci)}{check}")


def form_line(form: Any, tag: str, prefix: str, metrics: dict[str, float]) -> str:
    """Approach 3's goodness of fit (scaling.form_check); its numbers go into ``metrics``."""
    metrics[f"fit/{prefix}approach3_rms_residual"] = form.rms
    metrics[f"fit/{prefix}approach3_chi2_per_dof"] = (form.chi2 / form.dof if form.measured
                                                      else float("nan"))
    return f"Approach 3 form check{tag}: {form.sentence()}"

