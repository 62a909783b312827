"""The sweep launcher: the pending points of a plan -> ordinary ``scalelab-train`` runs -> MLflow.

Every point is a plain training run through the same code path as ``make train``
(``scaling/point_config.py`` writes its config file). With ``launcher=hydra`` one process runs
many points:

    scalelab-train --multirun <train overrides> +sweep_point=p000_x,p001_y,...
        hydra.searchpath=[file://<sweep>/conf] hydra/launcher=<basic|joblib|slurm...>
        hydra.sweep.dir=<sweep>/multirun/<stamp>

with ``launcher=subprocess`` one ``scalelab-train <train overrides> +sweep_point=<point>``
process runs each. Either way a point that crashes does not stop the others, and a point whose
FINISHED child already exists in MLflow is skipped on a rerun (``scaling/sweep_state.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base_run import BaseRun
from .launch_triage import triage
from .plan import Plan, PlanPoint
from .point_config import branch_checkpoint, point_overrides, train_command, write_point_config
from .slurm_jobs import LostJobs, wait_for_queue
from .sweep_settings import RunSettings
from .sweep_spec import SweepSpec
from .sweep_state import close_stale, latest_by_point, resumable, split_done, touched_since


@dataclass
class Outcome:
    """What one ``SweepRunner.run`` did, by point name."""

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
        self._lost: LostJobs | None = None  # a SLURM launch's jobs lost with their node
        self.experiment = settings.experiment_name or f"sweep_{settings.name}"

    def write_configs(self, points: list[PlanPoint]) -> None:
        """One config file per point to train (resuming a stopped run); stale files removed."""
        folder = self.conf_dir / "sweep_point"
        current = {f"{p.name}.yaml" for p in self.plan.points}
        for old in folder.glob("*.yaml") if folder.is_dir() else []:
            if old.name not in current:  # from an earlier plan of this sweep
                old.unlink()
        latest = latest_by_point(self.parent.children())
        for p in points:
            ov = point_overrides(p, self.spec, self.settings, self.base, self.sweep_dir,
                                 self.parent.run_id, self.experiment)
            if resumable(p, latest, self.sweep_dir):
                ov["resume"] = True
                self.echo(f"  resuming {p.name} from its checkpoint (run {latest[p.point_id].run_id})")
            write_point_config(self.conf_dir / "sweep_point" / f"{p.name}.yaml", p, ov)

    def run(self, estimates: dict[str, float] | None = None) -> Outcome:
        """Train the pending points (WSD main runs before their branches); the Outcome."""
        t0 = time.time()
        out = Outcome()
        stale = close_stale(self.parent)
        if stale:
            self.echo(f"closed {stale} child run(s) left RUNNING by an interrupted sweep (KILLED)")
        todo, done = split_done(self.plan.points, latest_by_point(self.parent.children()))
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
            latest = latest_by_point(self.parent.children())
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
        multirun_dir = self.sweep_dir / "multirun" / stamp
        slurm = multirun and "slurm" in self.settings.hydra_launcher
        self._lost = LostJobs(multirun_dir, points, self.echo) if slurm else None
        rc = self._run_process(cmd, log_path, points, started, out)
        if multirun:  # SLURM: jobs the launcher stopped waiting for
            wait_for_queue(multirun_dir, self.poll_s,
                           lambda: self._report_progress(points, started, out), self.echo)
        latest = self._report_progress(points, started, out)
        remaining = triage(points, latest, started, rc, log_path,
                           multirun_dir if multirun else None, out.failed, self.echo)
        if self._lost is not None:  # a point lost with its node is reported, not relaunched
            remaining = self._lost.settle(latest, remaining, out.failed, self.parent)
        return remaining

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
                    # wait() rather than sleep(): the sweep goes on the moment the launch ends
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=self.poll_s)
                    self._report_progress(points, started, out)
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                raise
        return int(proc.returncode)

    def _report_progress(self, points: list[PlanPoint], started: float, out: Outcome) -> dict:
        """Print each point of this launch that ended since the last look; the latest runs."""
        from scalelab.tracking.final import final_values

        latest = latest_by_point(self.parent.children())
        if self._lost is not None:
            self._lost.report(every_s=10.0)
        for p in points:
            c = latest.get(p.point_id)
            if c is None or p.name in self._seen or not touched_since(c, started):
                continue
            if c.done:
                self._seen.add(p.name)
                out.finished.append(p.name)
                loss = final_values(c.tags, c.metrics).get("val_loss", float("nan"))
                wall = (c.end_time - c.start_time) / 1000 if c.end_time else float("nan")
                self.echo(f"  ✓ {p.name:<24} C={p.budget:.2g}  N={p.n_params_matmul:>10,}  "
                          f"D={p.tokens:>12,}  val loss {loss:.4f}  {wall:5.0f} s  "
                          f"[{len(self._seen)}/{self._total}]")
                if self.on_finished is not None:
                    self.on_finished(p, c)
            elif c.status in ("FAILED", "KILLED", "FINISHED"):
                self._seen.add(p.name)
                why = c.status if c.status != "FINISHED" else f"FINISHED, final val loss {c.final_loss}"
                self.echo(f"  ✗ {p.name}  {why} (run {c.run_id})  [{len(self._seen)}/{self._total}]")
        return latest


def launch_order(points: list[PlanPoint], seconds: dict[str, float]) -> list[PlanPoint]:
    """Longest estimated run first (plan order among equals and without estimates): runs that
    share the cores then finish together, instead of one long run training alone at the end
    while the other cores idle (LPT scheduling)."""
    return sorted(points, key=lambda p: -seconds.get(p.name, 0.0))
