"""Running the tune stage of a sweep: train the lr grid, fit lr*(N), re-plan with it.

The grid runs are ordinary sweep points (children of the same MLflow parent, tagged
``sweep_stage=tune``), so a rerun skips the finished ones like any other point.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .plan import Plan, SweepSpec
from .tune import LrLaw, fit_lr_law, plot_tune, tune_plan


@dataclass
class TuneResult:
    law: LrLaw
    runs: pd.DataFrame  # N, budget, lr, lr_factor, loss, run_id, run_name
    folder: Path
    plot: Path
    failed: dict[str, str]


def run_tune_stage(plan: Plan, spec: SweepSpec, settings: Any, base: Any, sweep_dir: Path,
                   parent: Any, scorer: Any, echo: Callable[[str], None]
                   ) -> tuple[Plan, TuneResult | None]:
    from .collect import collect
    from .launch import SweepRunner, save_plan

    tp = tune_plan(plan)
    folder = sweep_dir / "tune"
    echo(f"tune stage: {len(tp.points)} runs (lr x {spec.tune_lr_factors} at "
         f"{len({p.n_params_matmul for p in tp.points})} sizes), {tp.total_compute:.3g} FLOPs")
    for path in save_plan(tp, folder).values():
        parent.log_artifact(path, "tune")
    runner = SweepRunner(tp, spec, settings, base, sweep_dir, parent, echo=echo,
                         on_finished=scorer)
    outcome = runner.run()
    if scorer is not None:
        scorer.score_all(tp.points)
    got = collect(parent, spec.n_convention, settings.flops_convention, curves=False,
                  point_ids={p.point_id for p in tp.points})
    runs = got.runs
    if runs.empty:
        echo("[red]tune stage: no run finished; the points keep the rule's lr[/red]")
        parent.set_tags({"sweep_tune": "failed: no run finished"})
        return plan, None
    by_id = {p.point_id: p for p in tp.points}
    runs = runs.assign(lr=[by_id[i].lr for i in runs["point_id"]],
                       lr_factor=[by_id[i].lr_factor for i in runs["point_id"]])
    try:
        law = fit_lr_law(runs)
    except ValueError as e:
        echo(f"[red]{e}; the points keep the rule's lr[/red]")
        parent.set_tags({"sweep_tune": f"failed: {e}"})
        return plan, None
    folder.mkdir(parents=True, exist_ok=True)
    cols = ["run_name", "run_id", "variant", "budget", "N", "D", "lr_factor", "lr", "loss",
            "loss_se", "loss_source"]
    runs[[c for c in cols if c in runs]].to_csv(folder / "runs.csv", index=False)
    (folder / "law.json").write_text(json.dumps(law.as_dict(), indent=2, default=float) + "\n")
    png = plot_tune(runs, law, folder / "tune.png")
    for path in (folder / "runs.csv", folder / "law.json", png):
        parent.log_artifact(path, "tune")
    parent.set_tags({"lr_law_coef": f"{law.coef:.6g}", "lr_law_exponent": f"{law.exponent:.4f}",
                       "lr_law": f"lr*(N) = {law.coef:.4g} * N^{law.exponent:.4f} (tune stage)"})
    flagged = law.sizes[law.sizes["flagged"]]
    echo(f"tune stage: lr*(N) = {law.coef:.4g} N^{law.exponent:.3f} from "
         f"{len(law.sizes)} sizes" + (f" ({len(flagged)} at the edge of the grid)" if len(flagged) else ""))
    return plan.with_lr_law(law.coef, law.exponent), TuneResult(law, runs, folder, png,
                                                                 dict(outcome.failed))
