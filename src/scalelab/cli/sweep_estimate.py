"""`scalelab-sweep`'s wall-time estimates: each size timed here before anything runs, the tune
rounds' preview, and the second estimate fitted to the tune runs' own wall times; and how many
runs share the cores (which sets every run's torch threads)."""

from __future__ import annotations

import time
from typing import Any


def tune_preview(plan: Any, speeds: tuple[dict, dict] | None, settings: Any) -> dict[str, Any]:
    """{round: (its runs before any law is known, their time estimates or None)}."""
    from scalelab.scaling.tune import preview_rounds
    from scalelab.scaling.wall_time import estimate_seconds

    return {name: (tp, estimate_seconds(tp, speeds[0], settings.run_overhead_s, speeds[1])
                   if speeds else None)
            for name, tp in preview_rounds(plan).items()}


def estimate_points(plan: Any, base: Any, settings: Any, console: Any
                    ) -> tuple[list[float] | None, tuple[dict, dict] | None]:
    """(each point's estimated seconds, (training FLOP/s, held-out scoring seconds) per
    shape), or (None, None)."""
    if not settings.estimate_time:
        return None, None
    if base.accelerator not in ("cpu", "auto"):
        console.print(f"[dim]no wall-time estimate: the runs use accelerator="
                      f"{base.accelerator}, this process times the CPU[/dim]")
        return None, None
    from scalelab.scaling.heldout import measure_seconds_per_window, score_seconds
    from scalelab.scaling.wall_time import estimate_seconds, measure_flops_per_s

    t0 = time.time()
    # time each size with the threads every parallel run will get (scalelab.runtime's rule)
    threads = base.cfg.train.num_threads or jobs_threads(settings)[1]
    fps = measure_flops_per_s(plan, base.micro_batch, threads=threads)
    console.print(f"[dim]measured training throughput of {len(fps)} sizes in "
                  f"{time.time() - t0:.1f} s: {min(fps.values()):.2g}-{max(fps.values()):.2g} "
                  "FLOP/s[/dim]")
    score: dict = {}
    if settings.heldout_tokens or settings.task_items:
        t0 = time.time()
        # the sweep process scores each run's checkpoint with 1 thread while others train
        score = score_seconds(measure_seconds_per_window(plan, threads=1),
                              settings.heldout_tokens, plan.seq_len, settings.task_items)
        on = [f"{settings.heldout_tokens:,} held-out tokens"] if settings.heldout_tokens else []
        on += [f"{settings.task_items:,} task items"] if settings.task_items else []
        console.print(f"[dim]measured scoring of {len(score)} sizes in "
                      f"{time.time() - t0:.1f} s: {min(score.values()):.1f}-"
                      f"{max(score.values()):.1f} s a run on {' and '.join(on)}[/dim]")
    return estimate_seconds(plan, fps, settings.run_overhead_s, score), (fps, score)


def parallel_jobs(settings: Any) -> int:
    """Runs at a time: hydra.launcher.n_jobs of the joblib launcher (its default: one per
    core), else 1. The threads per run follow from it (jobs_threads), so the joblib presets
    set neither n_jobs nor train.num_threads."""
    if settings.launcher != "hydra" or settings.hydra_launcher != "joblib":
        return 1
    n = -1  # the joblib preset's default: one job per core
    for o in settings.launcher_overrides:
        if o.startswith("hydra.launcher.n_jobs="):
            n = int(o.split("=", 1)[1])
    import os

    return max(1, os.cpu_count() or 1) if n < 1 else n


def jobs_threads(settings: Any) -> tuple[int, int]:
    """(runs at a time, torch threads each): cores // runs, the rule scalelab-train applies
    when SCALELAB_CONCURRENT_PROCS tells it how many runs share the cores."""
    from scalelab.runtime import jobs_and_threads

    return jobs_and_threads(parallel_jobs(settings))


def estimates_after_tune(plan: Any, tuned: Any, settings: Any, parent: Any,
                         console: Any) -> list[float] | None:
    """Each point's seconds from the tune runs' wall times (scaling/wall_time.py), printed
    and tagged on the parent; None without a tune stage or an estimate."""
    from scalelab.scaling.wall_time import fit_run_times

    model = fit_run_times(tuned.runs) if tuned is not None and settings.estimate_time else None
    if model is None:
        return None
    secs = [model.seconds(p) for p in plan.points]
    jobs = jobs_threads(settings)[0]
    minutes = sum(secs) / jobs / 60
    console.print(f"estimated wall time of the {len(secs)} points: {sum(secs) / 60:.1f} min one run "
                  f"after another; {minutes:.1f} min with {jobs} runs at a time ({model.describe()})")
    parent.set_tags({"sweep_estimate_after_tune_min": f"{minutes:.1f}"})
    return secs

