"""One sweep point as an ordinary training run: the keys it sets on the base config, its tags,
its Hydra config file (``<sweep>/conf/sweep_point/<point>.yaml``, package ``_global_``) and the
``scalelab-train`` command that runs it (``+sweep_point=<point>``, one or many)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from scalelab.data.files import atomic_write_text
from scalelab.training.devices import uses_gpu

from .base_run import BaseRun
from .plan import Plan, PlanPoint
from .shared_overrides import check_shared_overrides, shared_train_overrides
from .sweep_settings import RunSettings
from .sweep_spec import SweepSpec

TRAIN_MODULE = "scalelab.cli.train"


def _nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def point_overrides(p: PlanPoint, spec: SweepSpec, settings: RunSettings, base: BaseRun,
                    sweep_dir: Path, parent_run_id: str, experiment: str) -> dict[str, Any]:
    """The dotted keys one point sets on top of the base training config."""
    val_every = max(1, p.steps // settings.val_evals)
    d: dict[str, Any] = {f"model.{k}": v for k, v in p.model_overrides.items()}
    d |= {
        "run_name": p.name,
        "train.max_steps": p.steps,
        "train.max_tokens": p.tokens,
        "train.val_every": val_every,
        "train.val_batches": settings.val_batches,
        "trainer.max_steps": None,
        "trainer.log_every_n_steps": point_log_every(p.steps, settings.log_points, base),
        "trainer.enable_progress_bar": False,
        "callbacks.checkpoint.save_best": False,
        "logger.backend": "mlflow",
        "logger.tracking_uri": base.tracking_uri,
        "logger.experiment_name": experiment,
        "logger.parent_run_id": parent_run_id,
        "paths.output_dir": str(sweep_dir / "runs" / p.name),
    }
    # every point sets its own global batch: the tune stage's batch round and B*(N) change it
    # (D fixed, steps recomputed); see shared_train_overrides
    d["train.global_batch_size"] = (p.tokens_per_step if base.batch_unit == "tokens"
                                    else p.tokens_per_step // base.block_size)
    # seed replicates: the configured seed + replicate; set on replicate 0 too, so that a seed
    # override of the sweep reaches every replicate through the base config (shared_overrides)
    d["seed"] = base.seed + p.replicate
    d |= p.optim_overrides(spec.min_lr_ratio, spec.beta2)
    if p.save_at_steps:  # WSD main run: stable-phase checkpoints for its cooldown branches
        d["train.save_at_steps"] = list(p.save_at_steps)
    if p.branch_of:  # WSD branch: a new run from the main run's checkpoint at start_step
        d["train.init_from"] = str(branch_checkpoint(p, sweep_dir))
    d |= {f"tags.{k}": v for k, v in point_tags(p, settings).items()}
    if base.precision == "auto" and not uses_gpu(base.accelerator):
        # auto takes bf16 on a native-bf16 CPU only from d_model 128 up, so one study would train its
        # points in two precisions; a study keeps one: fp32 (bf16 was slower at sweep widths)
        d["trainer.precision"] = "32-true"
    d |= dict(p.extra_overrides)
    return d


def point_log_every(steps: int, log_points: int, base: BaseRun) -> int:
    """Lightning's logging cadence for a point of ``steps`` steps: about ``log_points`` rows,
    never more often than the base config's (the trainer preset's or the user's override).

    A sweep point's steps are small (milliseconds on CPU), and each logged step costs Lightning's
    logger connector plus the module's and the throughput callback's values, a visible share of
    such a step when every few steps are logged."""
    return max(base.log_every_n_steps, math.ceil(steps / log_points))


def check_point_overrides(plan: Plan, spec: SweepSpec, settings: RunSettings,
                          base: BaseRun) -> None:
    """Refuse a shared training override of a key the plan sets per point (shared_overrides)."""
    keys = {k for p in plan.points for k in point_overrides(p, spec, settings, base, Path("."),
                                                             "", "")}
    check_shared_overrides(settings.train_overrides, keys)


def point_tags(p: PlanPoint, settings: RunSettings) -> dict[str, str]:
    tags = {"sweep_point_id": p.point_id, "sweep_point": p.name, "sweep_name": settings.name,
            "sweep_budget": f"{p.budget:.6g}", "sweep_variant": p.variant,
            "sweep_size_index": str(p.size_index), "sweep_group_id": p.group_id or p.point_id,
            "sweep_replicate": str(p.replicate), "sweep_stage": p.stage}
    if p.stage == "tune":
        tags |= {"sweep_lr_factor": f"{p.lr_factor:g}", "sweep_tune_round": p.tune_round or "lr",
                 "sweep_batch_factor": f"{p.batch_factor:g}"}
        if p.beta2 is not None:
            tags["sweep_beta2"] = f"{p.beta2:g}"
    tags |= p.forecast_tags  # the forecast, on the run before it trains
    if p.branch_of:
        tags |= {"wsd_branch_of": p.branch_of, "wsd_start_step": str(p.start_step)}
    return tags


def branch_checkpoint(p: PlanPoint, sweep_dir: Path) -> Path:
    """Where a WSD branch's main run saves the checkpoint the branch starts from."""
    return sweep_dir / "runs" / p.branch_from / "checkpoints" / f"step_{p.start_step}.ckpt"


def write_point_config(path: Path, p: PlanPoint, overrides: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (f"# @package _global_\n# {p.name}: budget C={p.budget:.3g} FLOPs, variant {p.variant},"
            f" N={p.n_params_matmul:,} (matmul), D={p.tokens:,} tokens, {p.steps} steps\n")
    atomic_write_text(path, head + OmegaConf.to_yaml(OmegaConf.create(_nest(overrides))))


def train_command(train_overrides: list[str], point_names: list[str], conf_dir: Path,
                  multirun: bool, launcher: str = "basic",
                  launcher_overrides: list[str] | None = None,
                  sweep_dir: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", TRAIN_MODULE]
    if multirun:
        cmd.append("--multirun")
    cmd += shared_train_overrides(train_overrides)
    cmd += [f"+sweep_point={','.join(point_names)}", f"hydra.searchpath=[file://{conf_dir}]"]
    if multirun:
        cmd += [f"hydra/launcher={launcher}", *(launcher_overrides or [])]
        if sweep_dir is not None:
            cmd.append(f"hydra.sweep.dir={sweep_dir}")
    return cmd
