"""`scalelab-sweep`: plan, run, fit and report a scaling-law study (`make sweep`).

    scalelab-sweep                                   # sweep=cpu_small (conf/sweep/cpu_small.yaml)
    scalelab-sweep --plan-only sweep=cpu_tiny        # print the plan table; run nothing
    scalelab-sweep sweep=cpu_tiny sweep.budgets=[1e10,3e10] sweep.sizes_per_budget=4
    scalelab-sweep sweep=cpu_small model.mlp=gelu,swiglu    # variant axis: one law per variant
    scalelab-sweep sweep=h200 trainer.devices=1             # other keys reach every training run
    scalelab-sweep sweep=cpu_small hydra/launcher=joblib hydra.launcher.n_jobs=2   # 2 at a time

`sweep.*` overrides configure the study; every other override is appended to
sweep.train_overrides (a comma list such as model.norm_position=pre,post becomes a variant
axis). Rerunning the same command reuses the sweep folder and MLflow parent run and skips the
points that already finished.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from scalelab.cli.sweep_estimate import (
    estimate_points,
    estimates_after_tune,
    jobs_threads,
    tune_preview,
)
from scalelab.cli.sweep_fit import fit_and_report
from scalelab.cli.sweep_plan import fmt_seconds, print_plan
from scalelab.config.user_conf import check_user_config_folders
from scalelab.data.files import atomic_write_text, exclusive_folder
from scalelab.tracking.redact import redact

GROUPS_NOT_VARIANTS = "a variant axis must name a field (model.mlp=gelu,swiglu), not a config group"


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str], dict[str, list[Any]],
                                                   list[str]]:
    """-> (sweep config overrides, training overrides, variant axes from comma lists,
    launcher overrides: `hydra/launcher=joblib` and `hydra.launcher.*` for the multirun)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    sweep_ov, train_ov, variants, launch_ov = [], [], {}, []
    for text in overrides:
        try:
            o = parser.parse_override(text)
        except HydraException as e:
            raise ValueError(f"cannot parse override {text!r}: {e}. Quote list items that "
                             "contain '=', e.g. 'sweep.train_overrides=[\"model.mlp=swiglu\"]'"
                             ) from None
        key = o.key_or_group
        if key == "sweep" or key.startswith("sweep."):
            sweep_ov.append(text)
        elif key == "hydra/launcher" or key.startswith("hydra."):
            launch_ov.append(text)
        elif o.is_sweep_override():
            if "." not in key:
                raise ValueError(f"{text}: {GROUPS_NOT_VARIANTS}")
            values = getattr(o.value(), "list", None)
            if values is None:
                raise ValueError(f"{text}: only comma lists (a,b,c) make a variant axis")
            variants[key] = list(values)
        else:
            train_ov.append(text)
    return sweep_ov, train_ov, variants, launch_ov


def _parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scalelab-sweep", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--plan-only", action="store_true", help="print the plan and exit")
    ap.add_argument("--cfg", action="store_true", help="print the composed sweep config and exit")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (sweep.* or training keys)")
    return ap.parse_args(argv)


def _sweep_settings(cfg: Any, train_ov: list[str], variants: dict[str, list[Any]],
                    launch_ov: list[str]) -> tuple[Any, Any, Any]:
    """(SweepSpec, FamilyConfig, RunSettings) of the composed sweep config plus the command's
    training overrides, variant axes and launcher overrides."""
    from scalelab.scaling.sweep_settings import split_settings

    spec, family, settings = split_settings(OmegaConf.to_container(cfg.sweep, resolve=True))
    settings.train_overrides += train_ov
    for o in launch_ov:  # hydra/launcher=joblib picks the launcher; hydra.* keys configure it
        if o.startswith("hydra/launcher="):
            settings.hydra_launcher = o.split("=", 1)[1]
            settings.launcher = "hydra"
        else:
            settings.launcher_overrides.append(o)
    if variants:
        spec.variants = {**spec.variants, **variants}
    return spec, family, settings


def run(argv: list[str]) -> int:
    from rich.console import Console

    from scalelab.config.compose import compose
    from scalelab.scaling.base_run import build_plan, resolve_base, sweep_dir_of
    from scalelab.scaling.point_config import check_point_overrides

    args = _parse_args(argv)
    # a wide table even when stdout is a file or a pipe (rich would wrap at 80 columns)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    t_start = time.time()
    check_user_config_folders(args.overrides)  # a YAML error: one line, before any planning
    sweep_ov, train_ov, variants, launch_ov = split_overrides(args.overrides)
    try:
        cfg = compose("sweep", sweep_ov)
    except Exception as e:
        raise ValueError(f"sweep overrides {sweep_ov}: {e}") from None
    if args.cfg:
        print(OmegaConf.to_yaml(cfg))
        return 0
    spec, family, settings = _sweep_settings(cfg, train_ov, variants, launch_ov)
    console.print(f"[bold]scalelab-sweep[/bold] {settings.name}: preparing the base config "
                  f"({' '.join(settings.train_overrides) or 'defaults'})")
    base = resolve_base(settings.train_overrides)
    plan = build_plan(spec, family, settings, base)
    check_point_overrides(plan, spec, settings, base)
    estimates, speeds = estimate_points(plan, base, settings, console)
    tune = tune_preview(plan, speeds, settings) if spec.tune_lr_factors else None
    print_plan(plan, estimates, console, jobs_threads(settings)[0], tune)
    sweep_dir = sweep_dir_of(settings, base)
    if args.plan_only or settings.plan_only:
        console.print(f"plan only: nothing ran. Run it with: scalelab-sweep "
                      f"{' '.join(argv_without_plan_only(args.overrides))}".rstrip())
        return 0
    # one sweep per folder: a second one of the same name is refused, naming the first's PID
    with exclusive_folder(sweep_dir, "sweep folder"):
        return _run_sweep(plan, spec, settings, base, sweep_dir, estimates, console, t_start)


def _run_sweep(plan: Any, spec: Any, settings: Any, base: Any, sweep_dir: Path,
               estimates: list[float] | None, console: Any, t_start: float) -> int:
    """Open the parent run, train the pending points, then collect, fit and report."""
    from scalelab.scaling.heldout_scorer import HeldoutScorer, Scorers, TaskScorer
    from scalelab.tracking.sweep import HELDOUT_SET_TAG, TASK_SET_TAG, SweepParent

    heldout = _heldout_set(settings, base)  # a set that does not fit fails before any run
    task = _task_set(settings, base)
    experiment = settings.experiment_name or f"sweep_{settings.name}"
    from scalelab.tracking.store_check import check_sqlite_store

    check_sqlite_store(base.tracking_uri)  # a broken mlruns.db: one line, not a traceback
    parent = SweepParent.open(base.tracking_uri, experiment, settings.name, base.artifact_root)
    console.print(f"MLflow parent run {parent.run_id} ({'new' if parent.created else 'reopened'}) "
                  f"in experiment {experiment!r}, store {redact(base.tracking_uri)}")
    console.print(f"sweep folder: {sweep_dir}")
    parent.log_params(_parent_params(plan, settings))
    # the set this invocation scores on: a point scored on another one is scored again, or (with
    # no set now) falls back to its own validation loss (scaling.collect)
    parent.set_tags({HELDOUT_SET_TAG: heldout.fingerprint if heldout else "none",
                     TASK_SET_TAG: task.fingerprint if task else "none"})
    scorer = Scorers(HeldoutScorer(parent, sweep_dir, heldout, console.print) if heldout else None,
                     TaskScorer(parent, sweep_dir, task, console.print) if task else None)
    scorer = scorer if scorer.scorers else None
    try:
        plan, outcome, tuned = _train_points(plan, spec, settings, base, sweep_dir, parent,
                                             scorer, estimates, console)
    except KeyboardInterrupt:
        parent.end("KILLED")
        raise
    collected = _collect(parent, plan, spec, settings, sweep_dir)
    fit_lines: list[str] = []
    if settings.fit and not collected.runs.empty:
        try:  # the forecast stage trains for minutes too: a Ctrl-C there ends the parent KILLED
            forecast = _forecast(plan, collected, settings, base, sweep_dir, parent, scorer,
                                 console)
            if forecast is not None:
                outcome.failed |= forecast.failed
            fit_lines = fit_and_report(collected, plan, settings, sweep_dir, parent, console,
                                       tuned, forecast)
        except KeyboardInterrupt:
            parent.end("KILLED")
            raise
    wall = time.time() - t_start
    parent.log_metrics({"sweep/points": len(plan.points), "sweep/finished": len(collected.runs),
                        "sweep/failed": len(outcome.failed), "sweep/wall_seconds": wall,
                        "sweep/trained_now": len(outcome.finished)})
    parent.set_tags({"sweep_failed_points": ",".join(sorted(outcome.failed)) or "none"})
    parent.end("FINISHED" if not outcome.failed else "FAILED")
    _summary(console, plan, outcome, collected, fit_lines, parent, sweep_dir, wall)
    return 0 if not outcome.failed else 1


def _train_points(plan: Any, spec: Any, settings: Any, base: Any, sweep_dir: Path, parent: Any,
                  scorer: Any, estimates: list[float] | None, console: Any) -> tuple[Any, Any, Any]:
    """(the plan as run, the launch Outcome, the tune stage's result or None)."""
    import os

    from scalelab.runtime import CONCURRENT_ENV
    from scalelab.scaling.launch import SweepRunner
    from scalelab.scaling.plan import save_plan

    # each training process sizes its threads as cores // runs sharing them (scalelab.runtime)
    os.environ[CONCURRENT_ENV] = str(jobs_threads(settings)[0])
    tuned = None
    if spec.tune_lr_factors:
        from scalelab.scaling.stage import run_tune_stage

        plan, tuned = run_tune_stage(plan, spec, settings, base, sweep_dir, parent, scorer,
                                     console.print)
        print_plan(plan, None, console)
        after_tune = estimates_after_tune(plan, tuned, settings, parent, console)
        estimates = after_tune if tuned is not None else estimates
    plan_files = save_plan(plan, sweep_dir, estimates)
    for path in plan_files.values():
        parent.log_artifact(path, "plan")
    runner = SweepRunner(plan, spec, settings, base, sweep_dir, parent, echo=console.print,
                         on_finished=scorer)
    outcome = runner.run({p.name: s for p, s in zip(plan.points, estimates, strict=True)}
                         if estimates else None)
    if scorer is not None:
        scorer.score_all(plan.points)
    return plan, outcome, tuned


def _forecast(plan: Any, collected: Any, settings: Any, base: Any, sweep_dir: Path, parent: Any,
              scorer: Any, console: Any) -> Any:
    """The forecast stage (scaling/forecast_stage.py); None without one, or when the study's
    runs cannot carry it (said on the console and tagged on the parent)."""
    from scalelab.scaling.forecast_stage import forecast_skip_reason, run_forecast_stage

    why = forecast_skip_reason(plan)
    if why:
        console.print(f"[yellow]{why}[/yellow]")
        return None
    try:
        return run_forecast_stage(plan, collected.runs, settings, base, sweep_dir, parent, scorer,
                                  console.print)
    except ValueError as e:
        console.print(f"[red]{e}[/red]")
        parent.set_tags({"sweep_forecast": f"failed: {e}"})
        return None


def _collect(parent: Any, plan: Any, spec: Any, settings: Any, sweep_dir: Path) -> Any:
    """The sweep's runs and curves from MLflow, as CSV in the folder and on the parent run."""
    from scalelab.scaling.collect import collect

    collected = collect(parent, spec.n_convention, settings.flops_convention,
                        point_ids={p.point_id for p in plan.points}, train_tokens=plan.train_tokens)
    atomic_write_text(sweep_dir / "runs.csv", collected.runs.to_csv(index=False))
    atomic_write_text(sweep_dir / "curves.csv", collected.curves.to_csv(index=False))
    parent.log_artifact(sweep_dir / "runs.csv", "data")
    parent.log_artifact(sweep_dir / "curves.csv", "data")
    return collected


def _heldout_set(settings: Any, base: Any) -> Any:
    if not settings.heldout_tokens:
        return None
    if base.val_tokens is None:
        raise ValueError("sweep.heldout_tokens needs a causal-LM corpus with a validation split; "
                         "set sweep.heldout_tokens=0")
    from scalelab.scaling.heldout import HeldoutSet

    return HeldoutSet.from_tokens(base.val_tokens, base.block_size, settings.heldout_tokens)


def _task_set(settings: Any, base: Any) -> Any:
    """The line-ending task's items (sweep.task_items), or None without one."""
    if not settings.task_items:
        return None
    newline = []
    if base.val_tokens is not None and base.prepared_dir is not None:
        from scalelab.data.shards import PreparedData

        newline = PreparedData.load(base.prepared_dir).tokenizer.encode("\n")
    if len(newline) != 1:
        raise ValueError("sweep.task_items needs a causal-LM corpus with a validation split and "
                         "a tokenizer with a newline token (e.g. tokenizer=char); set "
                         "sweep.task_items=0")
    from scalelab.scaling.task_metric import ContinuationTask

    return ContinuationTask.from_tokens(base.val_tokens, newline[0], base.block_size,
                                        settings.task_items, settings.task_ending)


def argv_without_plan_only(overrides: list[str]) -> list[str]:
    return [o for o in overrides if o != "--plan-only"]


def _parent_params(plan: Any, settings: Any) -> dict[str, Any]:
    study = plan.spec
    return {
        "sweep_name": settings.name, "mode": study.mode, "budgets": study.budgets,
        "sizes_per_budget": study.sizes_per_budget, "size_span": study.size_span,
        "tokens_per_param_prior": study.tokens_per_param, "n_convention": study.n_convention,
        "flops_convention": settings.flops_convention, "lr": study.lr, "lr_rule": study.lr_rule,
        "base_width": study.base_width, "max_lr": study.max_lr, "min_lr_ratio": study.min_lr_ratio,
        "beta2": study.beta2, "warmup_tokens_per_param": study.warmup_tokens_per_param,
        "max_warmup_fraction": study.max_warmup_fraction, "variants": study.variants or "none",
        "family": plan.family.__dict__, "tokens_per_step": plan.tokens_per_step,
        "seq_len": plan.seq_len, "n_points": len(plan.points),
        "total_compute": plan.total_compute, "train_overrides": settings.train_overrides,
        "launcher": settings.launcher, "hydra_launcher": settings.hydra_launcher,
        "vocab_size": plan.base_model.get("vocab_size"), "train_tokens": plan.train_tokens,
    }


def _summary(console: Any, plan: Any, outcome: Any, collected: Any, fit_lines: list[str],
             parent: Any, sweep_dir: Path, wall: float) -> None:
    line = "─" * 72
    console.print(line)
    console.print(f"[bold]sweep {plan.spec.name} done[/bold] in {fmt_seconds(wall)}: "
                  f"{len(outcome.finished)} trained now, {len(outcome.skipped)} skipped "
                  f"(already finished), {len(outcome.failed)} failed; "
                  f"{len(collected.runs)}/{len(plan.points)} points have a finished run")
    for name, why in sorted(outcome.failed.items()):
        console.print(f"  [red]failed[/red] {name}: {why}")
    for ln in fit_lines:
        console.print(ln)
    console.print(f"sweep folder : {sweep_dir}")
    console.print(f"MLflow parent: {parent.run_id} (experiment id {parent.experiment_id}); "
                  f"children tagged mlflow.parentRunId")
    ui = "make ui" if not parent.tracking_uri.startswith("http") else parent.tracking_uri
    console.print(f"open it      : {ui} -> {parent.view_url()}")
    if outcome.failed:
        console.print("rerun the same command to retry the failed points "
                      "(finished points are skipped)")
    console.print(line)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # progress lines must reach a log file (nohup, CI) as they happen, not at exit
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    try:
        code = run(argv)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to continue (finished points are skipped)",
              file=sys.stderr)
        sys.exit(130)
    sys.exit(code)


if __name__ == "__main__":
    main()
