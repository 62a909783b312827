"""The sweep launcher: base config -> plan -> one ordinary `scalelab-train` run per point -> MLflow.

Every point is a plain training run through the same code path as `make train`: the sweep
writes one Hydra config file per point (``<sweep>/conf/sweep_point/<point>.yaml``, package
``_global_``: shape, token budget, lr, warmup, parent run id, tags) and launches

    scalelab-train --multirun <train overrides> +sweep_point=p000_x,p001_y,...
        hydra.searchpath=[file://<sweep>/conf] hydra/launcher=<basic|joblib|slurm...>
        hydra.sweep.dir=<sweep>/multirun/<stamp>

(``launcher=hydra``), or one ``scalelab-train <train overrides> +sweep_point=<point>`` process
per point (``launcher=subprocess``). Either way a point that crashes does not stop the others,
and a point whose FINISHED child already exists in MLflow is skipped on a rerun.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from scalelab.data.files import atomic_write_json, atomic_write_text
from scalelab.scaling.plan import FamilyConfig, Plan, PlanPoint, SweepSpec, make_plan
from scalelab.scaling.shared_overrides import check_shared_overrides, shared_train_overrides
from scalelab.training.devices import uses_gpu

LAUNCHERS = ("hydra", "subprocess")
TRAIN_MODULE = "scalelab.cli.train"


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------
@dataclass
class RunSettings:
    """The runner's keys of ``conf/sweep.yaml`` (the planner's are in SweepSpec/FamilyConfig)."""

    name: str = "sweep"
    plan_only: bool = False
    train_overrides: list[str] = field(default_factory=list)
    flops_convention: str = "attention"
    launcher: str = "hydra"
    hydra_launcher: str = "basic"
    launcher_overrides: list[str] = field(default_factory=list)
    val_evals: int = 12
    val_batches: int = 10
    # about this many rows of train metrics per point (see point_log_every)
    log_points: int = 100
    experiment_name: str | None = None
    output_dir: str | None = None
    estimate_time: bool = True
    run_overhead_s: float = 8.0
    fit: bool = True
    bootstrap: int = 200
    # every point's final loss on one fixed set of this many validation tokens (0: off, the
    # fits use each run's own final/val_loss); see scaling/heldout.py
    heldout_tokens: int = 0

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"sweep.launcher={self.launcher!r}: choose one of {', '.join(LAUNCHERS)}")
        if self.flops_convention not in ("attention", "6n"):
            raise ValueError(f"sweep.flops_convention={self.flops_convention!r}: choose attention or 6n")
        if not self.name or any(c in self.name for c in "/\\ ,=") or self.name.startswith("."):
            # the folder is sweeps/<name>: "..", "../x" or ".x" would leave or hide it
            raise ValueError(f"sweep.name={self.name!r}: a folder-safe name (no / , = or spaces, "
                             "not starting with a dot)")
        if isinstance(self.heldout_tokens, bool) or int(self.heldout_tokens) < 0:
            raise ValueError(f"sweep.heldout_tokens={self.heldout_tokens!r}: a token count >= 0 "
                             "(0 turns the fixed held-out evaluation off)")
        self.heldout_tokens = int(self.heldout_tokens)
        if self.val_evals < 1 or self.val_batches < 1:
            raise ValueError("sweep.val_evals and sweep.val_batches must be >= 1")
        if isinstance(self.log_points, bool) or int(self.log_points) < 1:
            raise ValueError(f"sweep.log_points={self.log_points!r}: rows of train metrics per "
                             "point, an integer >= 1")
        self.log_points = int(self.log_points)
        self.train_overrides = [str(o) for o in self.train_overrides]
        self.launcher_overrides = [str(o) for o in self.launcher_overrides]


def split_settings(sweep: dict[str, Any]) -> tuple[SweepSpec, FamilyConfig, RunSettings]:
    """``cfg.sweep`` (a plain dict) -> the three config objects; unknown keys fail, named."""
    sweep = dict(sweep)
    family = FamilyConfig(**dict(sweep.pop("family", {}) or {}))
    run_keys = {f.name for f in dataclasses.fields(RunSettings)}
    spec_keys = SweepSpec.field_names()
    unknown = sorted(set(sweep) - run_keys - spec_keys)
    if unknown:
        raise ValueError(f"sweep: unknown key(s) {unknown}; valid keys are "
                         f"{sorted(run_keys | spec_keys | {'family'})}")
    spec = SweepSpec.from_dict({k: v for k, v in sweep.items() if k in spec_keys})
    if "name" in sweep:
        spec.name = str(sweep["name"])
    settings = RunSettings(**{k: v for k, v in sweep.items() if k in run_keys})
    return spec, family, settings


# --------------------------------------------------------------------------------------------
# The base training config (what `scalelab-train <train_overrides>` would run)
# --------------------------------------------------------------------------------------------
@dataclass
class BaseRun:
    cfg: DictConfig
    model_fields: dict[str, Any]  # with the tokenizer's vocab_size filled in
    tokens_per_step: int
    micro_batch: int
    block_size: int
    train_tokens: int | None
    tracking_uri: str
    artifact_root: str | None
    root: Path
    accelerator: str
    val_tokens: Any = None  # the validation split's tokens (memmap), for the held-out set
    batch_unit: str = "sequences"  # what train.global_batch_size counts (sequences | tokens)
    batch_quantum: int = 1  # the global batch (sequences) must be a multiple of this
    seed: int = 0  # the configured seed: replicate r of a point trains with seed + r
    # the trainer's logging cadence: the floor of each point's (point_log_every); 50 is Lightning's
    log_every_n_steps: int = 50
    precision: str = "32-true"  # trainer.precision as configured (on a CPU, points run auto as 32-true)


def resolve_base(train_overrides: list[str], progress: bool = True) -> BaseRun:
    """Validate the shared training config like `scalelab-train` does, and prepare its data."""
    from scalelab.config.compose import compose
    from scalelab.config.spec import build_spec
    from scalelab.tracking.store import resolve_tracking_uri

    try:
        cfg = compose("train", train_overrides)
    except Exception as e:  # hydra's override/compose errors: say where they came from
        raise ValueError(f"sweep.train_overrides {train_overrides}: {e}") from None
    spec = build_spec(cfg)
    root = Path(str(cfg.paths.root))
    vocab, train_tokens, val_tokens = spec.model.vocab_size, None, None
    if spec.objective != "seq2seq":
        from scalelab.data import prepare

        prepared = prepare(spec.data, spec.tokenizer, cache_dir=Path(str(cfg.paths.data_dir)),
                           progress=progress)
        vocab = prepared.vocab_size
        train_tokens = len(prepared.tokens("train"))
        val_tokens = prepared.tokens("val")
    spec.with_vocab(vocab)  # validates
    # the fields as configured (n_kv_heads/d_ff may be null = derived), with the real vocab
    model_fields = dict(spec.model_fields, vocab_size=spec.model_fields.get("vocab_size") or vocab)
    uri = None
    if cfg.logger.backend == "mlflow":
        uri = resolve_tracking_uri(cfg.logger.tracking_uri, root)
    if uri is None:
        raise ValueError("sweeps need MLflow (logger=mlflow): the children and the parent run "
                         "are how a sweep records and skips points")
    return BaseRun(cfg, model_fields, spec.batch.tokens_per_step, spec.batch.micro_batch,
                   spec.block_size, train_tokens, uri,
                   str(cfg.logger.artifact_root) if cfg.logger.artifact_root else None, root,
                   str(cfg.trainer.accelerator), val_tokens, str(spec.train.batch_unit),
                   (spec.train.micro_batch_size or 1) * spec.world_size, int(cfg.seed),
                   int(cfg.trainer.get("log_every_n_steps") or 50), str(cfg.trainer.precision))


def build_plan(spec: SweepSpec, family: FamilyConfig, settings: RunSettings,
               base: BaseRun) -> Plan:
    identity = {"train_overrides": settings.train_overrides,
                "val_evals": settings.val_evals, "val_batches": settings.val_batches}
    return make_plan(spec, family, base.model_fields, base.tokens_per_step,
                     train_tokens=base.train_tokens, identity=identity, seq_len=base.block_size,
                     batch_quantum=base.batch_quantum)


def sweep_dir_of(settings: RunSettings, base: BaseRun) -> Path:
    if settings.output_dir:
        return Path(settings.output_dir).expanduser().resolve()
    return base.root / "sweeps" / settings.name


# --------------------------------------------------------------------------------------------
# Point configs
# --------------------------------------------------------------------------------------------
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
        "run_name": p.label,
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
    logger connector plus the module's and the throughput callback's values: at every 10th step
    made a 2,000-step cpu_medium point ~15 % slower than every 100th (docs/performance.md)."""
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


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    finished: list[str] = field(default_factory=list)  # trained now
    skipped: list[str] = field(default_factory=list)  # FINISHED before this invocation
    failed: dict[str, str] = field(default_factory=dict)  # point -> reason
    seconds: float = 0.0
    commands: list[str] = field(default_factory=list)


class SweepRunner:
    """Launches the pending points of a plan and follows them in MLflow."""

    def __init__(self, plan: Plan, spec: SweepSpec, settings: RunSettings, base: BaseRun,
                 sweep_dir: Path, parent: Any, echo: Callable[[str], None] = print,
                 poll_s: float = 3.0,
                 on_finished: Callable[[PlanPoint, Any], None] | None = None) -> None:
        self.plan, self.spec, self.settings, self.base = plan, spec, settings, base
        self.on_finished = on_finished  # e.g. the held-out evaluation, while the others train
        self.sweep_dir, self.parent, self.echo, self.poll_s = sweep_dir, parent, echo, poll_s
        self.conf_dir = sweep_dir / "conf"
        self.experiment = settings.experiment_name or f"sweep_{settings.name}"

    # --- state in MLflow -------------------------------------------------------------------
    def _latest_by_point(self) -> dict[str, Any]:
        latest: dict[str, Any] = {}
        for c in sorted(self.parent.children(), key=lambda c: c.start_time):
            prev = latest.get(c.point_id) if c.point_id else None
            # the newest child wins, except that a done one is never displaced
            if c.point_id and (prev is None or not prev.done or c.done):
                latest[c.point_id] = c
        return latest

    def close_stale(self) -> int:
        """Children left RUNNING by a killed sweep -> KILLED (they are resumed or retrained);
        one whose process still runs on this host is left alone."""
        n = 0
        for c in self.parent.children():
            if c.status in ("RUNNING", "SCHEDULED") and not c.process_alive():
                self.parent.mark_killed(c.run_id)
                n += 1
        return n

    def resumable(self, p: PlanPoint, latest: dict[str, Any]) -> bool:
        """A point whose run was stopped (KILLED) after a checkpoint continues that run."""
        c = latest.get(p.point_id)
        run_dir = self.sweep_dir / "runs" / p.name
        rid = run_dir / "mlflow_run_id"
        return (c is not None and c.status == "KILLED" and rid.is_file()
                and (run_dir / "checkpoints" / "last.ckpt").is_file()
                and rid.read_text().strip() == c.run_id)

    def pending(self) -> tuple[list[PlanPoint], list[PlanPoint]]:
        latest = self._latest_by_point()
        done = [p for p in self.plan.points
                if latest.get(p.point_id) is not None and latest[p.point_id].done]
        ids = {p.point_id for p in done}
        return [p for p in self.plan.points if p.point_id not in ids], done

    # --- launching -------------------------------------------------------------------------
    def write_configs(self, points: list[PlanPoint]) -> None:
        folder = self.conf_dir / "sweep_point"
        current = {f"{p.name}.yaml" for p in self.plan.points}
        for old in folder.glob("*.yaml") if folder.is_dir() else []:
            if old.name not in current:  # from an earlier plan of this sweep
                old.unlink()
        latest = self._latest_by_point()
        for p in points:
            ov = point_overrides(p, self.spec, self.settings, self.base, self.sweep_dir,
                                 self.parent.run_id, self.experiment)
            if self.resumable(p, latest):
                ov["resume"] = True
                self.echo(f"  resuming {p.name} from its checkpoint (run {latest[p.point_id].run_id})")
            write_point_config(self.conf_dir / "sweep_point" / f"{p.name}.yaml", p, ov)

    def run(self, estimates: dict[str, float] | None = None) -> Outcome:
        t0 = time.time()
        out = Outcome()
        stale = self.close_stale()
        if stale:
            self.echo(f"closed {stale} child run(s) left RUNNING by an interrupted sweep (KILLED)")
        todo, done = self.pending()
        out.skipped = [p.name for p in done]
        if done:
            self.echo(f"skipping {len(done)} point(s) already FINISHED in MLflow: "
                      + ", ".join(p.name for p in done))
        if not todo:
            self.echo("nothing to train: every point is finished")
            out.seconds = time.time() - t0
            return out
        self.write_configs(todo)
        self.echo(f"training {len(todo)} point(s) with launcher={self.settings.launcher}"
                  + (f" ({self.settings.hydra_launcher})" if self.settings.launcher == "hydra" else "")
                  + f"; logs in {self.sweep_dir / 'logs'}")
        self._estimates = estimates or {}
        self._total = len(todo)
        self._seen: set[str] = set()
        # WSD: main runs first; then the cooldown branches whose main run finished (a second
        # launch), since each branch starts from a checkpoint its main run saves on the way
        self._launch_all([p for p in todo if p.branch_of is None], out)
        branches = [p for p in todo if p.branch_of is not None]
        if branches:
            latest = self._latest_by_point()
            ready = []
            for p in branches:
                main = latest.get(p.branch_of or "")
                ckpt = branch_checkpoint(p, self.sweep_dir)
                if main is None or not main.done:
                    out.failed[p.name] = f"its main run {p.branch_from} did not finish; rerun the sweep"
                elif not ckpt.is_file():
                    out.failed[p.name] = (f"{ckpt} is missing (the main run's folder was moved or "
                                          f"cleaned); delete the FINISHED run of {p.branch_from} "
                                          "in MLflow and rerun the sweep to retrain it")
                else:
                    ready.append(p)
                    continue
                self.echo(f"  ✗ {p.name}: {out.failed[p.name]}")
            if ready:
                self.echo(f"training {len(ready)} WSD cooldown branch(es)")
                self._launch_all(ready, out)
        out.seconds = time.time() - t0
        return out

    def _launch_all(self, points: list[PlanPoint], out: Outcome) -> None:
        if self.settings.launcher == "subprocess":
            for p in points:
                self._launch([p], out, multirun=False)
        else:
            remaining = launch_order(points, self._estimates)
            while remaining:
                remaining = self._launch(remaining, out, multirun=True)

    def _launch(self, points: list[PlanPoint], out: Outcome, multirun: bool) -> list[PlanPoint]:
        """Run ``points`` in one process; returns the points it neither finished nor failed."""
        logs = self.sweep_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if (self.sweep_dir / "multirun" / stamp).exists():  # two launches in one second (WSD)
            stamp += f"_{time.time_ns() % 1_000_000:06d}"
        log_path = logs / (f"multirun_{stamp}.log" if multirun else f"{points[0].name}.log")
        cmd = train_command(self.settings.train_overrides, [p.name for p in points], self.conf_dir,
                            multirun, self.settings.hydra_launcher, self.settings.launcher_overrides,
                            self.sweep_dir / "multirun" / stamp)
        out.commands.append(" ".join(cmd))
        started = time.time()
        rc = self._run_process(cmd, log_path, points, started, out)
        latest = self._report_progress(points, started, out)
        return self._triage(points, latest, started, rc, log_path,
                            self.sweep_dir / "multirun" / stamp if multirun else None, out)

    def _run_process(self, cmd: list[str], log_path: Path, points: list[PlanPoint],
                     started: float, out: Outcome) -> int:
        """Run ``cmd`` with its output appended to ``log_path``, reporting progress; its exit code."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(log_path, "ab") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                while proc.poll() is None:
                    time.sleep(self.poll_s)
                    self._report_progress(points, started, out)
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
        return int(proc.returncode)

    def _triage(self, points: list[PlanPoint], latest: dict[str, Any], started: float, rc: int,
                log_path: Path, multirun_dir: Path | None, out: Outcome) -> list[PlanPoint]:
        """Record why each point of a launch that is not done failed; return the points to retry.
        ``multirun_dir`` (None for a single-point launch) holds one folder per started job."""
        # Hydra's launchers catch a job's exception and go on with the next job; a job that
        # started has its folder <hydra.sweep.dir>/<job number> (the order of `points`).
        remaining, unrecorded = [], []
        progressed = False  # some point of this launch ended in MLflow (a stop, not a crash)
        for i, p in enumerate(points):
            c = latest.get(p.point_id)
            fresh = c is not None and _touched_since(c, started)
            progressed = progressed or (fresh and c.status in ("FINISHED", "FAILED", "KILLED"))
            if c is not None and c.done:
                continue
            if fresh and c.status in ("FAILED", "KILLED", "FINISHED"):
                what = c.status if c.status != "FINISHED" else f"final val loss {c.final_loss}"
                out.failed.setdefault(p.name, f"run {c.run_id} {what}; see {log_path}: "
                                      + _error_line(log_path, p.name))
            elif multirun_dir is None or (multirun_dir / str(i)).is_dir():
                unrecorded.append(p)  # it ran, but failed before creating its MLflow run
            else:
                remaining.append(p)  # never started: the process died first
        crashed = rc < 0 or (remaining and rc != 0)
        if crashed and unrecorded:
            # the process died inside the last job it started; retry the others
            *retry, culprit = unrecorded
            remaining = retry + remaining
            unrecorded = [culprit]
        for p in unrecorded:
            out.failed[p.name] = (f"exit code {rc}, no FINISHED run; see {log_path}: "
                                  + _error_line(log_path, p.name))
            self.echo(f"  ✗ {p.name}: {out.failed[p.name]}")
        if remaining and not crashed:
            for p in remaining:
                out.failed[p.name] = f"never started (exit code {rc}); see {log_path}"
            remaining = []
        elif remaining and not unrecorded and not progressed:  # no progress to tell apart: blame one
            first = remaining.pop(0)
            out.failed[first.name] = f"exit code {rc} before it started; see {log_path}: " \
                + _error_line(log_path, first.name)
        return remaining

    def _report_progress(self, points: list[PlanPoint], started: float, out: Outcome) -> dict:
        from scalelab.tracking.final import final_values

        latest = self._latest_by_point()
        for p in points:
            c = latest.get(p.point_id)
            if c is None or p.name in self._seen or not _touched_since(c, started):
                continue
            if c.done:
                self._seen.add(p.name)
                out.finished.append(p.name)
                loss = final_values(c.tags, c.metrics).get("val_loss", float("nan"))
                wall = (c.end_time - c.start_time) / 1000 if c.end_time else float("nan")
                self.echo(f"  ✓ {p.label:<24} C={p.budget:.2g}  N={p.n_params_matmul:>10,}  "
                          f"D={p.tokens:>12,}  val loss {loss:.4f}  {wall:5.0f} s  "
                          f"[{len(self._seen)}/{self._total}]")
                if self.on_finished is not None:
                    self.on_finished(p, c)
            elif c.status in ("FAILED", "KILLED", "FINISHED"):
                self._seen.add(p.name)
                why = c.status if c.status != "FINISHED" else f"FINISHED, final val loss {c.final_loss}"
                self.echo(f"  ✗ {p.name}  {why} (run {c.run_id})  [{len(self._seen)}/{self._total}]")
        return latest


def _touched_since(c: Any, started: float) -> bool:
    """Started or ended during this launch (a resumed child keeps its old start time). The
    end time gets no slack: close_stale ends orphaned children just before the launch."""
    return c.start_time >= started * 1000 - 1000 or (c.end_time or 0) > started * 1000


class HeldoutScorer:
    """Scores each finished point's final checkpoint on the sweep's fixed held-out set and
    logs final/heldout_loss, _se and _tokens to the point's own MLflow run."""

    def __init__(self, parent: Any, sweep_dir: Path, heldout: Any,
                 echo: Callable[[str], None] = print) -> None:
        self.parent, self.sweep_dir, self.heldout, self.echo = parent, sweep_dir, heldout, echo
        self.fingerprint = heldout.fingerprint
        self.scored = self.rescored = 0

    def __call__(self, p: PlanPoint, child: Any) -> None:
        from scalelab.scaling.heldout import HELDOUT_KEYS, evaluate_checkpoint
        from scalelab.tracking.sweep import HELDOUT_SET_TAG

        was, had = child.tags.get(HELDOUT_SET_TAG), HELDOUT_KEYS[0] in child.metrics
        if had and was == self.fingerprint:
            return
        ckpt = self.sweep_dir / "runs" / p.name / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():  # trained under an earlier plan, where its index differed
            found = sorted(self.sweep_dir.glob(f"runs/*_{p.point_id[:8]}/checkpoints/last.ckpt"))
            ckpt = found[-1] if found else ckpt
        if not ckpt.is_file():
            self.echo(f"  [yellow]{p.label}: no {ckpt}; its fits use final/val_loss[/yellow]")
            return
        m = evaluate_checkpoint(ckpt, self.heldout)
        for k, v in m.items():
            self.parent.client.log_metric(child.run_id, k, v)
        self.parent.client.set_tag(child.run_id, HELDOUT_SET_TAG, self.fingerprint)
        child.metrics.update(m)
        child.tags[HELDOUT_SET_TAG] = self.fingerprint
        self.scored += 1
        again = ""
        if had:  # scored before on another set (or before sets had fingerprints)
            self.rescored += 1
            again = " (scored again: the held-out set changed)"
        self.echo(f"    held-out {p.label}: {m[HELDOUT_KEYS[0]]:.4f} ± {m[HELDOUT_KEYS[1]]:.4f} "
                  f"({m[HELDOUT_KEYS[1]] / m[HELDOUT_KEYS[0]]:.2%}) on {m[HELDOUT_KEYS[2]]:,.0f} "
                  f"tokens{again}")

    def score_all(self, points: list[PlanPoint]) -> None:
        """Every finished point not scored yet (e.g. trained by an earlier invocation)."""
        from scalelab.scaling.collect import latest_finished

        done = latest_finished(self.parent.children())
        for p in points:
            if p.point_id in done:
                self(p, done[p.point_id])


def _error_line(log_path: Path, point: str) -> str:
    """The most telling line of a log: the last 'Error'/'Exception' line, else the last line.

    In a basic-launcher multirun log, the lines after Hydra's ``#k : ... +sweep_point=<point>``
    marker (up to the next marker) belong to that point; they are searched first.
    """
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""

    def best(seg: list[str]) -> str:
        hits = [ln.strip() for ln in seg if ("Error" in ln or "Exception" in ln or
                                             ln.startswith("error:")) and ln.strip()]
        return hits[-1] if hits else ""

    marks = [i for i, ln in enumerate(lines) if "[HYDRA]" in ln and "+sweep_point=" in ln]
    mine = [i for i in marks if f"+sweep_point={point}" in lines[i]]
    if mine:
        end = next((j for j in marks if j > mine[-1]), len(lines))
        hit = best(lines[mine[-1]:end])
        if hit:
            return hit[:300]
    tail = [ln.strip() for ln in lines if ln.strip()]
    return (best(lines) or (tail[-1] if tail else ""))[:300]


def launch_order(points: list[PlanPoint], seconds: dict[str, float]) -> list[PlanPoint]:
    """Longest estimated run first (plan order among equals and without estimates): runs that
    share the cores then finish together, instead of one long run training alone at the end
    while the other cores idle (LPT scheduling)."""
    return sorted(points, key=lambda p: -seconds.get(p.name, 0.0))


def save_plan(plan: Plan, sweep_dir: Path, estimates: list[float] | None = None) -> dict[str, Path]:
    """plan.json + plan.csv in the sweep folder (also logged to the parent run)."""
    import pandas as pd

    sweep_dir.mkdir(parents=True, exist_ok=True)
    rows = plan.rows()
    if estimates is not None:
        for r, s in zip(rows, estimates, strict=True):
            r["est_seconds"] = round(s, 1)
    paths = {"json": sweep_dir / "plan.json", "csv": sweep_dir / "plan.csv"}
    atomic_write_json(paths["json"], plan.to_dict(), default=str)
    atomic_write_text(paths["csv"], pd.DataFrame(rows).to_csv(index=False))
    return paths



def fit_sweep(runs: Any, curves: Any, n_convention: str, flops_convention: str, n_boot: int,
              source: str) -> tuple[Any, list[str]]:
    """Fit every approach the data allows: (ScalingResults or None, notes on what was left out)."""
    from scalelab.scaling.fit import fit_available
    from scalelab.scaling.fit_data import FitOptions

    return fit_available(runs, curves, FitOptions(n_convention=n_convention,
                                                  flops_convention=flops_convention,
                                                  n_boot=n_boot), source=source)
