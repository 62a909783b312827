"""Read a sweep's child runs back from MLflow into tables the fits use.

``runs``: one row per plan point (the latest FINISHED child for each point hash), with every
accounting convention side by side and ``N``/``C`` set by the chosen ones:

    run_id point point_id variant budget  N D C loss bpb
    n_params n_params_non_embedding n_params_matmul  flops flops_6n
    flops_per_token flops_per_token_6n
    d_model n_layers n_heads lr steps wall_s

``curves``: validation loss curves, one row per evaluation: run_id step tokens flops loss
(flops = flops_per_token * tokens, in the chosen convention; the fit joins N and variant).
``failed``: children that did not finish (point, status, run_id, reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from scalelab.model.accounting import N_KEYS
from scalelab.tracking.final import final_values
from scalelab.tracking.redact import redact
from scalelab.tracking.sweep import (
    HELDOUT_SET_TAG,
    TASK_SET_TAG,
    ChildRun,
    SweepParent,
    metric_histories,
    open_parent,
)

# N convention -> column (the logged param's key), as scalelab.scaling.fit_data reads them
N_COLUMNS = N_KEYS
C_COLUMNS = {"attention": "flops", "6n": "flops_6n"}
# the fixed held-out set's loss when the sweep scored it (sweep.heldout_tokens), else the run's own
FINAL_LOSS_KEYS = ("final/heldout_loss", "final/val_loss", "val/loss")
CURVE_COLUMNS = ["run_id", "step", "tokens", "flops", "loss"]


@dataclass
class Collected:
    runs: pd.DataFrame
    curves: pd.DataFrame
    failed: pd.DataFrame


def _num(d: dict[str, str], key: str, default: float = float("nan")) -> float:
    try:
        return float(d[key])
    except (KeyError, TypeError, ValueError):
        return default


def _row(c: ChildRun, heldout_set: str | None = None, task_set: str | None = None) -> dict:
    p, t = c.params, c.tags
    # final values (tags final.*, or older runs' final/* metrics) as final/<name> beside the curves
    m = {**c.metrics, **{f"final/{k}": v for k, v in final_values(t, c.metrics).items()}}
    if heldout_set is not None and t.get(HELDOUT_SET_TAG) != heldout_set:
        # scored on another held-out set than the sweep's (or on none): not comparable
        m = {k: v for k, v in m.items() if not k.startswith("final/heldout_")}
    if t.get(TASK_SET_TAG) != task_set:  # no task now, or scored on other items
        m = {k: v for k, v in m.items() if not k.startswith("final/task_")}
    fpt, fpt6 = _num(p, "flops_per_token"), _num(p, "flops_per_token_6n")
    # tokens actually trained on: the final count, else the planned budget
    tokens = _num(m, "final/tokens_seen", _num(p, "tokens_budget", _num(m, "tokens_seen")))
    loss_key = next((k for k in FINAL_LOSS_KEYS if k in m), "")
    loss = m.get(loss_key, float("nan"))
    wall = (c.end_time - c.start_time) / 1000 if c.end_time else float("nan")
    return {
        "run_id": c.run_id, "point": t.get("sweep_point", c.name), "point_id": c.point_id,
        "variant": t.get("sweep_variant", "default"),
        "budget": _num(t, "sweep_budget", _num(p, "compute")),
        "size_index": int(_num(t, "sweep_size_index", 0)),
        **{key: _num(p, key) for key in N_KEYS.values()}, "D": tokens,
        "flops": fpt * tokens, "flops_6n": fpt6 * tokens,
        "flops_per_token": fpt, "flops_per_token_6n": fpt6,
        "loss": float(loss), "bpb": float(m.get("final/val_bpb", m.get("val/bpb", float("nan")))),
        "d_model": int(_num(p, "d_model", 0)), "n_layers": int(_num(p, "n_layers", 0)),
        "n_heads": int(_num(p, "n_heads", 0)), "lr": _num(p, "lr"),
        "steps": int(_num(p, "max_steps", 0)), "tokens_per_step": _num(p, "global_batch_tokens"),
        "wall_s": wall, "status": c.status,
        # WSD cooldown branch: point id of the main run it branched from ("" otherwise)
        "wsd_branch_of": t.get("wsd_branch_of", ""),
        # replicates of one point share its group id (sweep.seeds); the fits average them
        "group_id": t.get("sweep_group_id", c.point_id or c.run_id),
        "replicate": int(_num(t, "sweep_replicate", 0)), "stage": t.get("sweep_stage", "main"),
        "lr_factor": _num(t, "sweep_lr_factor", 1.0), "loss_source": loss_key,
        "loss_se": _num(m, "final/heldout_se"), "val_loss": _num(m, "final/val_loss"), "heldout_tokens": _num(m, "final/heldout_tokens"),
        "task_loss": _num(m, "final/task_loss"), "task_acc": _num(m, "final/task_acc"),
        "task_acc_se": _num(m, "final/task_acc_se"),
        "run_name": c.name,
    }


def latest_finished(children: list[ChildRun]) -> dict[str, ChildRun]:
    """point_id -> its newest done child (FINISHED with a finite final loss; a point trained
    twice counts once)."""
    out: dict[str, ChildRun] = {}
    for c in sorted(children, key=lambda c: c.start_time):
        if c.done and c.point_id:
            out[c.point_id] = c
    return out


def collect(parent: SweepParent, n_convention: str = "matmul",
            flops_convention: str = "attention", curves: bool = True,
            point_ids: set[str] | None = None, train_tokens: int | None = None,
            curve_stages: set[str] | None = None) -> Collected:
    """Children of ``parent`` -> tables. ``point_ids`` limits them to the current plan;
    ``train_tokens`` (the corpus's train split) adds each run's ``epochs`` = D / train_tokens;
    ``curve_stages`` limits the curves to runs of those sweep stages (None: all)."""
    if n_convention not in N_COLUMNS:
        raise ValueError(f"n_convention={n_convention!r}: choose one of {', '.join(N_COLUMNS)}")
    if flops_convention not in C_COLUMNS:
        raise ValueError(
            f"flops_convention={flops_convention!r}: choose one of {', '.join(C_COLUMNS)}")
    children = parent.children()
    if point_ids is not None:
        children = [c for c in children if c.point_id in point_ids]
    done = latest_finished(children)
    heldout_set, task_set = parent.heldout_set(), parent.task_set()
    rows = [_row(c, heldout_set, task_set) for c in done.values()]
    cols = ["run_id", "point", "point_id", "variant", "budget", "size_index", "N", "D", "C",
            "loss", "bpb"]
    runs = pd.DataFrame(rows)
    if runs.empty:
        runs = pd.DataFrame(columns=cols)
    else:
        runs["N"] = runs[N_COLUMNS[n_convention]]
        runs["C"] = runs[C_COLUMNS[flops_convention]]
        runs = runs[cols + [c for c in runs.columns if c not in cols]]
        runs = runs.sort_values(["variant", "budget", "N"]).reset_index(drop=True)
        if train_tokens:
            runs["epochs"] = runs["D"] / float(train_tokens)

    failed_rows = []
    for c in children:
        if c.point_id in done or c.done:
            continue
        reason = c.tags.get("sweep_note", "")
        if c.status == "FINISHED":  # finished, but without a finite final val loss
            reason = f"final val loss {c.final_loss}"
        failed_rows.append({"point": c.tags.get("sweep_point", c.name), "status": c.status,
                            "run_id": c.run_id, "reason": reason})
    failed = pd.DataFrame(failed_rows, columns=["point", "status", "run_id", "reason"])

    curve_df = pd.DataFrame(columns=CURVE_COLUMNS)
    if curves and not runs.empty:
        wanted = runs if curve_stages is None else runs[runs["stage"].isin(curve_stages)]
        logged = {c.run_id: set(c.metrics) for c in done.values()}
        curve_df = _curves(parent, wanted, flops_convention, logged)
    return Collected(runs, curve_df, failed)


def _curves(parent: SweepParent, runs: pd.DataFrame, flops_convention: str,
            logged: dict[str, set[str]]) -> pd.DataFrame:
    fpt_col = "flops_per_token" if flops_convention == "attention" else "flops_per_token_6n"
    # The runs table came from search_runs (each metric's latest value). Only the curves need
    # histories, and only of the metrics a run logged at all (search_runs lists those): read
    # together, concurrently against a server. The global batch is fixed, so an evaluation at
    # step s follows s x tokens_per_step tokens; the tokens_seen history (a count every few
    # steps) is read only for a run that does not record its tokens per step, which halves
    # the requests of a large sweep.
    def tps(r: Any) -> float:
        return r.tokens_per_step if r.tokens_per_step == r.tokens_per_step else 0.0

    per_step = {r.run_id: tps(r) for r in runs.itertuples()}
    pairs = [(rid, key) for rid in runs["run_id"] if "val/loss" in logged.get(rid, ())
             for key in ("val/loss", "tokens_seen") if key in logged[rid]
             and (key == "val/loss" or not per_step[rid] > 0)]
    history = metric_histories(parent.client, parent.tracking_uri, pairs)
    frames = []
    for r in runs.itertuples():
        loss = history.get((r.run_id, "val/loss"))
        if not loss:
            continue
        seen = dict(history.get((r.run_id, "tokens_seen"), []))
        rate = per_step[r.run_id]
        tokens = [step * rate if rate > 0 else seen.get(step, 0.0) for step, _ in loss]
        df = pd.DataFrame({"run_id": r.run_id, "step": [s for s, _ in loss], "tokens": tokens,
                           "loss": [v for _, v in loss]})
        df["flops"] = df["tokens"] * getattr(r, fpt_col)
        frames.append(df[df["tokens"] > 0])
    if not frames:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def find_parent(sweep: str | None = None, parent_run_id: str | None = None,
                tracking_uri: str | None = None) -> SweepParent:
    """A sweep's parent run by sweep name (experiment ``sweep_<name>``) or by run id."""
    from scalelab.paths import repo_root
    from scalelab.tracking.store import resolve_tracking_uri
    from scalelab.tracking.sweep import find_sweep_parent

    uri = resolve_tracking_uri(tracking_uri, repo_root())
    if parent_run_id:
        return open_parent(uri, parent_run_id)
    if not sweep:
        raise ValueError("give a sweep name (--sweep NAME) or a parent run id (--parent-run-id ID)")
    parent = find_sweep_parent(uri, sweep)
    if parent is None:
        raise ValueError(f"no sweep named {sweep!r} in {redact(uri)} (no parent run tagged "
                         f"scalelab.sweep_name={sweep!r}); run `scalelab-sweep sweep=...` first, "
                         "or pass --tracking-uri / --parent-run-id")
    return parent


def collect_runs(sweep: str | None = None, parent_run_id: str | None = None,
                 tracking_uri: str | None = None, n_convention: str = "matmul",
                 flops_convention: str = "attention") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of a sweep given by name or parent run id (for `scalelab-fit`)."""
    parent = find_parent(sweep, parent_run_id, tracking_uri)
    # only the points of the sweep's current plan (an earlier plan may have left other runs)
    got = collect(parent, n_convention, flops_convention, point_ids=parent.plan_point_ids(),
                  train_tokens=parent.train_tokens(), curve_stages={"main"})
    if not got.runs.empty:  # the tune stage's lr grid is not part of the study's fits
        got.runs = got.runs[got.runs["stage"] == "main"].reset_index(drop=True)
        got.curves = got.curves[got.curves["run_id"].isin(got.runs["run_id"])]
    if got.runs.empty:
        raise ValueError(f"sweep {sweep or parent_run_id}: no FINISHED child runs under parent "
                         f"{parent.run_id} in {redact(parent.tracking_uri)}")
    return got.runs, got.curves
