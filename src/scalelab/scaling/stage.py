"""Running the tune stage of a sweep: its rounds one after the other (lr, then batch at lr*(N),
then beta2 at lr*(N) and B*(N); scaling/tune.py), each trained, collected and fitted per variant
before the next is planned; then the plan re-made with what they fitted.

The rounds' runs are ordinary sweep points (children of the same MLflow parent, tagged
``sweep_stage=tune`` and ``sweep_tune_round``), so a rerun skips the finished ones like any
other point. A round that yields no law stops the stage; the points keep what the rounds before
it fitted (and the rule's values for the rest).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .plan import Plan
from .sweep_spec import SweepSpec
from .tune import Round, VariantTune, active_rounds
from .tune_fit import per_variant
from .tune_plot import plot_hparams, plot_tune

RUN_COLUMNS = [
    "round",
    "run_name",
    "run_id",
    "variant",
    "budget",
    "N",
    "D",
    "lr_factor",
    "lr",
    "batch_factor",
    "batch",
    "beta2",
    "loss",
    "loss_se",
    "loss_source",
    "steps",  # with wall_s and flops: what scaling/wall_time.py fits the points' estimate to
    "flops",
    "wall_s",
]


@dataclass
class TuneResult:
    tuned: dict[str, VariantTune]  # per variant: what the rounds fitted
    runs: pd.DataFrame  # every round's runs (RUN_COLUMNS)
    folder: Path
    plots: list[Path]
    failed: dict[str, str]
    notes: list[str] = field(default_factory=list)  # e.g. the batch factors a size dropped


@dataclass
class _Context:
    """What training a round needs (the arguments of run_tune_stage)."""

    spec: SweepSpec
    settings: Any
    base: Any
    sweep_dir: Path
    parent: Any
    scorer: Any
    echo: Callable[[str], None]


def run_tune_stage(
    plan: Plan,
    spec: SweepSpec,
    settings: Any,
    base: Any,
    sweep_dir: Path,
    parent: Any,
    scorer: Any,
    echo: Callable[[str], None],
) -> tuple[Plan, TuneResult | None]:
    ctx = _Context(spec, settings, base, sweep_dir, parent, scorer, echo)
    tuned = {v: VariantTune() for v in plan.variants}
    frames: list[pd.DataFrame] = []
    failed: dict[str, str] = {}
    notes: list[str] = []
    for rnd in active_rounds(spec):
        tp, dropped = rnd.plan(plan, tuned)
        for note in dropped:
            echo(f"[yellow]tune stage: {note}[/yellow]")
        notes += dropped
        runs, round_failed = _train_round(rnd, tp, ctx)
        failed |= round_failed
        why = _fit_round(rnd, runs, tuned)
        if why:
            kept = (
                "the points keep the rule's values"
                if not frames
                else "the points get what the earlier rounds fitted"
            )
            echo(f"[red]tune stage, {rnd.name} round: {why}; {kept}[/red]")
            parent.set_tags({"sweep_tune": f"failed: {rnd.name} round: {why}"})
            break
        frames.append(runs)
        for line in _summaries(rnd, tuned):
            echo(f"tune stage: {line}")
    if not frames:
        return plan, None
    result = _record(pd.concat(frames, ignore_index=True), tuned, failed, notes, ctx)
    fitted = {v: t.hparams() for v, t in tuned.items()}
    return plan.with_hparams(fitted), result


def _train_round(rnd: Round, tp: Plan, ctx: _Context) -> tuple[pd.DataFrame, dict[str, str]]:
    """Train a round's pending runs; its finished runs with the round's grid columns."""
    from .collect import collect
    from .launch import SweepRunner
    from .plan import save_plan

    folder = ctx.sweep_dir / "tune" / ("" if rnd.name == "lr" else rnd.name)
    ctx.echo(
        f"tune stage, {rnd.name} round: {len(tp.points)} runs (sweep.{rnd.key}="
        f"{getattr(ctx.spec, rnd.key)} at {len({p.n_params_matmul for p in tp.points})} "
        f"sizes), {tp.total_compute:.3g} FLOPs"
    )
    for path in save_plan(tp, folder).values():
        ctx.parent.log_artifact(path, "tune" if rnd.name == "lr" else f"tune/{rnd.name}")
    outcome = SweepRunner(
        tp,
        ctx.spec,
        ctx.settings,
        ctx.base,
        ctx.sweep_dir,
        ctx.parent,
        echo=ctx.echo,
        on_finished=ctx.scorer,
    ).run()
    if ctx.scorer is not None:
        ctx.scorer.score_all(tp.points)
    runs = collect(
        ctx.parent,
        ctx.spec.n_convention,
        ctx.settings.flops_convention,
        curves=False,
        point_ids={p.point_id for p in tp.points},
    ).runs
    if runs.empty:
        return runs, dict(outcome.failed)
    by_id = {p.point_id: p for p in tp.points}
    pts = [by_id[i] for i in runs["point_id"]]
    runs = runs.assign(
        round=rnd.name,
        lr=[p.lr for p in pts],
        lr_factor=[p.lr_factor for p in pts],
        batch=[p.tokens_per_step // tp.seq_len for p in pts],
        batch_factor=[p.batch_factor for p in pts],
        beta2=[ctx.spec.beta2 if p.beta2 is None else p.beta2 for p in pts],
    )
    return runs, dict(outcome.failed)


def _fit_round(rnd: Round, runs: pd.DataFrame, tuned: dict[str, VariantTune]) -> str:
    """Fit the round per variant into ``tuned``; "" or why it could not."""
    if runs.empty:
        return "no run finished"
    try:
        got = per_variant(runs, rnd.fit)
    except ValueError as e:
        return str(e)
    missing = sorted(set(tuned) - set(got))
    if missing:
        return f"no finished run of variant(s) {missing}"
    for variant, result in got.items():
        if variant in tuned:
            setattr(tuned[variant], rnd.name, result)
    return ""


def _summaries(rnd: Round, tuned: dict[str, VariantTune]) -> list[str]:
    out = []
    for variant, t in sorted(tuned.items()):
        tag = f" [{variant}]" if len(tuned) > 1 else ""
        got = getattr(t, rnd.name)
        if rnd.name == "beta2":
            table = ", ".join(
                f"{r.beta2:g}: {r.mean_rel_excess:+.2%}" for r in got.table.itertuples()
            )
            out.append(
                f"beta2 = {got.best:g}{tag} (mean loss relative to each size's best: {table})"
            )
        else:
            n_flag = int(got.sizes["flagged"].sum())
            note = got.basis_note()
            out.append(
                f"{got.describe()}{tag} from {len(got.sizes)} sizes"
                + (f" ({n_flag} flagged)" if n_flag else "")
                + (f"; {note}" if note else "")
            )
    return out


def _record(
    runs: pd.DataFrame,
    tuned: dict[str, VariantTune],
    failed: dict[str, str],
    notes: list[str],
    ctx: _Context,
) -> TuneResult:
    """runs.csv, law.json and the plots in <sweep>/tune (and on the parent), tags on the parent."""
    folder = ctx.sweep_dir / "tune"
    folder.mkdir(parents=True, exist_ok=True)
    runs[[c for c in RUN_COLUMNS if c in runs]].to_csv(folder / "runs.csv", index=False)
    law: dict[str, Any] = {"variants": {v: t.as_dict() for v, t in tuned.items()}, "notes": notes}
    if len(tuned) == 1 and next(iter(tuned.values())).lr is not None:
        only = next(iter(tuned.values())).lr  # the form sweep.lr_law takes, to reuse the law
        law |= only.law()
    (folder / "law.json").write_text(json.dumps(law, indent=2, default=float) + "\n")
    plots = [plot_tune(runs[runs["round"] == "lr"], tuned, folder / "tune.png")]
    if (runs["round"] != "lr").any():
        plots.append(plot_hparams(runs, tuned, folder / "tune_hparams.png"))
    for path in (folder / "runs.csv", folder / "law.json", *plots):
        ctx.parent.log_artifact(path, "tune")
    ctx.parent.set_tags(law_tags(tuned))
    return TuneResult(tuned, runs, folder, plots, failed, notes)


def law_tags(tuned: dict[str, VariantTune]) -> dict[str, str]:
    """Parent-run tags of the fitted laws: numbers per variant (a ``.<variant>`` suffix when
    there are several), and one readable line per hyperparameter."""
    tags: dict[str, str] = {}
    lines: dict[str, list[str]] = {"lr_law": [], "batch_law": [], "beta2_choice": []}
    for variant, t in sorted(tuned.items()):
        sfx = "" if len(tuned) == 1 else "." + re.sub(r"[^\w.\- /]", "_", variant)
        tag = "" if len(tuned) == 1 else f" [{variant}]"
        for key in ("lr", "batch"):
            law = getattr(t, key)
            if law is not None:
                tags |= {
                    f"{key}_law_coef{sfx}": f"{law.coef:.6g}",
                    f"{key}_law_exponent{sfx}": f"{law.exponent:.4f}",
                }
                if law.d_exponent:
                    tags[f"{key}_law_d_exponent{sfx}"] = f"{law.d_exponent:.4f}"
                lines[f"{key}_law"].append(f"{law.describe()}{tag}")
        if t.beta2 is not None:
            tags[f"tuned_beta2{sfx}"] = f"{t.beta2.best:g}"
            lines["beta2_choice"].append(f"{t.beta2.best:g}{tag}")
    tags |= {k: "; ".join(v) + " (tune stage)" for k, v in lines.items() if v}
    return tags
