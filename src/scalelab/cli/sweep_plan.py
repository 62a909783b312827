"""The sweep plan as `scalelab-sweep` prints it: one row per run, then the shared settings (lr,
batch and beta2 as the points get them: the tune stage's laws once it has run) and the time."""

from __future__ import annotations

from typing import Any

from scalelab.scaling.laws import law_text


def fmt_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def print_plan(plan: Any, estimates: list[float] | None, console: Any,
               parallel: int = 1, tune: dict[str, Any] | None = None) -> None:
    """The plan table and its settings; ``tune``: the tune rounds' preview (see sweep_estimate.tune_preview)."""
    from rich.table import Table

    multi = len(plan.variants) > 1
    wsd = any(p.branch_of for p in plan.points)
    batch = any(p.tokens_per_step != plan.tokens_per_step for p in plan.points)
    beta2 = any(p.beta2 is not None for p in plan.points)
    t = Table(title=f"sweep plan: {len(plan.points)} runs, "
                    f"{plan.total_compute:.3g} training FLOPs in all", show_lines=False)
    cols = ["run name"] + (["variant"] if multi else []) + [
        "C (FLOPs)", "N (matmul)", "N non-emb", "N total", "d", "L", "heads", "D (tokens)",
        "D/N", "steps"] + (["batch"] if batch else []) + ["lr"] + (["beta2"] if beta2 else []) + [
        "warmup"] + (["WSD branch of"] if wsd else []) + (
        ["est. time"] if estimates else [])
    for c in cols:
        t.add_column(c, justify="left" if c in ("run name", "variant") else "right")
    for i, p in enumerate(plan.points):
        row = [p.name] + ([p.variant] if multi else []) + [
            f"{p.budget:.3g}", f"{p.n_params_matmul:,}", f"{p.n_params_non_embedding:,}",
            f"{p.n_params:,}", str(p.d_model), str(p.n_layers), str(p.n_heads), f"{p.tokens:,}",
            f"{p.tokens / p.n_params_matmul:.1f}", str(p.steps)] + (
            [str(p.tokens_per_step // plan.seq_len)] if batch else []) + [f"{p.lr:.2e}"] + (
            [f"{p.beta2 if p.beta2 is not None else plan.spec.beta2:g}"] if beta2 else []) + [
            str(p.warmup_steps)] + ([f"{p.branch_from} @ {p.start_step}" if p.branch_of else ""]
                                    if wsd else []) + ([fmt_seconds(estimates[i])] if estimates else [])
        t.add_row(*row)
    console.print(t)
    console.print(_settings_line(plan))
    n_branch = sum(1 for p in plan.points if p.branch_of)
    if n_branch:
        console.print(
            f"WSD: {len(plan.points) - n_branch} main runs (decay over the last "
            f"{plan.spec.wsd_decay_fraction:.0%}) + {n_branch} cooldown branches at "
            f"{[q for q in plan.spec.wsd_fractions if q < 1]} x D, each started from its main run's "
            f"stable-phase checkpoint; total cost {plan.total_compute:.3g} FLOPs = "
            f"{plan.total_compute / plan.main_compute:.2f}x the main runs")
    tune_s = _print_tune_preview(plan, tune, console) if tune else 0.0
    forecast = _forecast_text(plan)
    if forecast:
        console.print(forecast)
    if estimates:
        total = sum(estimates) + tune_s
        par = f"; {fmt_seconds(total / parallel)} with {parallel} runs at a time" if parallel > 1 else ""
        console.print(f"estimated wall time{' with the tune stage' if tune_s else ''}: "
                      f"{fmt_seconds(total)} one run after another{par} "
                      "(each size's training and any held-out scoring timed here, + start-up per run)")


def _forecast_text(plan: Any) -> str:
    """What the forecast stage will do after the study (its runs depend on the study's fit)."""
    from scalelab.scaling.forecast_stage import forecast_skip_reason

    spec = plan.spec
    if not spec.forecast_multiples:
        return ""
    why = forecast_skip_reason(plan)
    if why:
        return f"[yellow]{why}[/yellow]"
    top = max(spec.budgets)
    targets = ", ".join(f"{m:g}x (C = {m * top:.3g})" for m in spec.forecast_multiples)
    if not spec.forecast_train:
        return f"then a forecast at {targets}: forecast only (sweep.forecast_train=false)"
    grid = len(spec.forecast_lr_factors or [1]) * len(spec.forecast_batch_factors or [1]) - 1
    cost = 3 * sum(spec.forecast_multiples) * top + grid * spec.forecast_multiples[0] * top
    extra = (f" + an lr x batch grid of {grid} runs at {spec.forecast_multiples[0]:g}x"
             if grid else "")
    return (f"then a forecast at {targets}: N*, 2N* and N*/2 trained at each{extra}, "
            f"~{cost:.3g} FLOPs ({cost / plan.total_compute:.1f}x the study)")


def _settings_line(plan: Any) -> str:
    """The plan's shared settings, under its table: batch, lr and beta2 as the points get them
    (the tune stage's laws once it has run), schedule and conventions."""
    study = plan.spec
    parts = [f"tokens/step {plan.tokens_per_step:,} (T={plan.seq_len})", _lr_text(plan)]
    parts.append(f"warmup ~{study.warmup_tokens_per_param:g} N tokens, <= "
                 f"{study.max_warmup_fraction:.0%} of steps")
    if study.tune_lr_factors and not plan.tuned:
        parts.append(f"tune stage first: {_tune_rounds_text(study)}")
    if study.seeds > 1:
        parts.append(f"{study.seeds} seeds per point")
    parts.append(f"{'wsd' if study.wsd else 'cosine'} to {study.min_lr_ratio:g}x")
    parts.append(_beta2_text(plan))
    parts.append(f"N convention {study.n_convention}; FLOPs = 6N + 12LTd from ModelConfig")
    return "; ".join(parts)


def _law_text(law: dict[str, float], what: str) -> str:
    return law_text(law, what, digits=3)


def _lr_text(plan: Any) -> str:
    study, tuned = plan.spec, plan.tuned or {}
    laws = {v: t["lr"] for v, t in tuned.items() if "lr" in t}
    batch = {v: t["batch"] for v, t in tuned.items() if "batch" in t}
    if laws:
        out = "tuned " + ", ".join(_law_text(law, "lr") + (f" ({v})" if len(laws) > 1 else "")
                                   for v, law in laws.items())
        if batch:
            out += ", " + ", ".join(_law_text(law, "B") + (f" ({v})" if len(batch) > 1 else "")
                                    for v, law in batch.items()) + " sequences"
        if study.laws_from and not study.tune_lr_factors:
            out += f" (sweep.laws_from={study.laws_from})"
        return out
    if plan.lr_law:
        return f"{_law_text(plan.lr_law, 'lr')} (sweep.lr_law)"
    rule = f"lr={study.lr:g}"
    if study.lr_rule != "fixed":
        rule += f" x {study.base_width}/d" + (f", max {study.max_lr:g}"
                                             if study.max_lr is not None else "")
    return f"lr rule {study.lr_rule} ({rule})"


def _beta2_text(plan: Any) -> str:
    chosen = sorted({str(t["beta2"]) + (f" ({v})" if len(plan.tuned) > 1 else "")
                     for v, t in (plan.tuned or {}).items() if "beta2" in t})
    if chosen:
        return f"AdamW beta2 tuned: {', '.join(chosen)}"
    return f"AdamW beta2={plan.spec.beta2:g}"


def _tune_rounds_text(study: Any) -> str:
    out = f"lr x {study.tune_lr_factors} -> lr*(N)"
    if study.tune_batch_factors:
        out += f", then batch x {study.tune_batch_factors} at lr*(N) -> B*(N)"
    if study.tune_beta2s:
        out += f", then beta2 in {study.tune_beta2s} -> one beta2"
    return out + " (per variant) for every point"


def _print_tune_preview(plan: Any, tune: dict[str, Any], console: Any) -> float:
    """One line per tune round (runs, FLOPs, estimated time); the rounds' total seconds."""
    seconds = 0.0
    for name, (tp, est) in tune.items():
        s = sum(est) if est else 0.0
        seconds += s
        console.print(f"tune stage, {name} round: {len(tp.points)} runs, {tp.total_compute:.3g} "
                      f"FLOPs ({tp.total_compute / plan.total_compute:.0%} of the study)"
                      + (f", ~{fmt_seconds(s)} one after another" if est else ""))
    return seconds
