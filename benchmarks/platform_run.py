"""Side (3): ``scalelab-train`` as a subprocess, with the bench's PhaseTimer added to its
callbacks from the command line, its MLflow store a SQLite file in the bench's work folder."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lockstep import Pipes
from benchmarks.presets import ROOT, data_dir


def create_store(store: Path, env: dict[str, str]) -> None:
    """Create the MLflow store before any timed run: a new store runs MLflow's schema
    migrations (seconds), a one-off cost that would land in the first run's first step."""
    if store.exists():
        return
    store.parent.mkdir(parents=True, exist_ok=True)
    code = ("import sys; from mlflow.tracking import MlflowClient; "
            "MlflowClient(sys.argv[1]).search_experiments()")
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{store}"], check=True,
                   capture_output=True, cwd=ROOT, env=env)


def source_env(src: Path) -> dict[str, str]:
    """The environment of a run of the scalelab source in ``src`` (a checkout's src folder)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else str(src)}


@dataclass
class PlatformRun:
    """One ``scalelab-train`` process; with ``pipes``, it takes turns with the bench."""

    proc: subprocess.Popen[bytes]
    phases: Path
    log: Path
    t0: float
    pipes: Pipes | None = None
    turn_steps: int = 1

    @classmethod
    def start(cls, overrides: list[str], workdir: Path, src: Path = ROOT / "src",
              lockstep: bool = False, turn_steps: int = 1, tag: str = "run") -> PlatformRun:
        env = source_env(src)
        store_dir = workdir / tag
        create_store(store_dir / "mlruns.db", env)
        stamp = time.time_ns()
        out, phases, log = (workdir / f"{k}_{tag}_{stamp}" for k in ("run", "phases", "log"))
        pipes = Pipes() if lockstep else None
        timer = f"path: '{phases}'" + (
            f", lockstep: '{pipes.callback_arg}', every: {turn_steps}" if pipes else "")
        args = [sys.executable, "-m", "scalelab.cli.train", *overrides,
                f"+callbacks.bench_phases={{_target_: benchmarks.phase_timer.PhaseTimer, {timer}}}",
                f"paths.output_dir={out}", f"paths.data_dir={data_dir()}",  # the bench's token cache
                f"logger.tracking_uri=sqlite:///{store_dir}/mlruns.db",
                f"logger.artifact_root={store_dir}/mlartifacts"]
        with log.open("w") as f:
            t0 = time.time()
            proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                    pass_fds=pipes.run_ends if pipes else ())
        if pipes is not None:
            pipes.started()
        return cls(proc, phases, log, t0, pipes, turn_steps)

    def finish(self) -> dict[str, Any]:
        """Wait for the run to exit; its figures, from the PhaseTimer's record."""
        if self.pipes is not None:
            self.pipes.close()  # a run still waiting for its turn trains on alone
        self.proc.wait()
        t_end = time.time()
        if self.proc.returncode != 0 or not self.phases.is_file():
            raise RuntimeError(f"scalelab-train failed ({self.proc.returncode}):\n"
                               f"{self.log.read_text()[-3000:]}")
        return run_figures(json.loads(self.phases.read_text()), self.t0, t_end, self.turn_steps)


    def kill(self) -> None:
        """Stop a run that is still going (after a failure on the bench's side)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.pipes is not None:
            self.pipes.close()


def rate(turns: list[Any]) -> float | None:
    """Tokens per second over turns of (wall s, CPU s, tokens, ...)."""
    wall = sum(t[0] for t in turns)
    return sum(t[2] for t in turns) / wall if wall > 0 else None


def run_figures(p: dict[str, Any], t0: float, t_end: float, turn_steps: int = 1) -> dict[str, Any]:
    """Steady tokens/s and step seconds from its turns (after 2 of warm-up, leaving out those
    that held a validation: the overhead figures count them), time to first step, the mean
    validation event (validation, sample, checkpoints), what followed fit (end-of-run work and
    exit), its wall without the pauses, the last val loss and the final step."""
    cycles = [c for c in p["cycles"][2:] if not c[3]]
    paused, gaps, first = sum(w for w, _ in p["pauses"]), [w for w, _ in p["val_gaps"]], p["first_step_unix"]
    return {"tokens_per_s": rate(cycles), "turns": len(cycles),
            "step_s": statistics.mean(c[0] for c in cycles) / turn_steps if cycles else None,
            "time_to_first_step_s": None if first is None else first - t0,
            "val_event_s": statistics.mean(gaps) if gaps else None,
            "after_fit_s": t_end - p["fit_end_unix"], "wall_s": t_end - t0 - paused,
            "paused_s": paused, "val_loss": p.get("val_loss"), "steps": p.get("final_step")}


def projected_overhead(run: dict[str, Any], max_steps: int, val_every: int) -> float | None:
    """Share of a default-length run's wall spent validating, sampling and checkpointing: the
    measured validation event times the validations the defaults schedule, plus the end of the
    run (final validation, sample, checkpoint, exit), over the whole run."""
    step, val, end = run.get("step_s"), run.get("val_event_s"), run.get("after_fit_s")
    if step is None or val is None or end is None:
        return None
    extra = (max_steps - 1) // val_every * val + end
    return extra / ((run.get("time_to_first_step_s") or 0.0) + max_steps * step + extra)
