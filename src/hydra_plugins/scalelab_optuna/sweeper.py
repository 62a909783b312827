"""`scalelab-train -m hparams_search=NAME`: an Optuna search as a Hydra sweeper.

Optuna's public API only (create_study / ask / tell): the search space is Hydra's sweep syntax
(``interval``, ``tag(log, interval(...))``, ``int(interval(...))``, ``range``, ``choice``) under
``hydra.sweeper.params`` or on the command line. Each batch of ``n_jobs`` trials goes through
the configured Hydra launcher (basic: one after another in this process; joblib or submitit:
in parallel, in other processes). The study lives in an RDB storage (default
``<root>/optuna.db``; PostgreSQL for trials on several machines): each job opens its trial there
to report its val loss for pruning (training/pruning.py), and a search started again with the
same study name goes on where it stopped. Each trial is a job of
the multirun, hence a child of its one MLflow parent run. The best trial is printed and saved as
a ready-to-run command (``<sweep dir>/best_trial.yaml``).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.errors import CompactHydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("scalelab.search")


class OptunaSweeper(Sweeper):
    def __init__(self, study_name: str, storage: str, direction: str = "minimize",
                 n_trials: int = 20, n_jobs: int = 1, sampler: str = "tpe",
                 seed: int | None = None, pruner: str = "median", pruner_startup_trials: int = 3,
                 pruner_warmup_steps: int = 0, params: dict[str, str] | None = None) -> None:
        self.study_name, self.storage, self.direction = study_name, storage, direction
        self.n_trials, self.n_jobs = int(n_trials), max(1, int(n_jobs))
        self.sampler, self.seed, self.pruner = sampler, seed, pruner
        self.pruner_startup_trials, self.pruner_warmup_steps = pruner_startup_trials, pruner_warmup_steps
        self.params = {str(k): str(v) for k, v in (params or {}).items()}

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config = config
        self.config_loader = hydra_context.config_loader  # validate_batch_is_legal reads it
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)
        self.sweep_dir = Path(str(config.hydra.sweep.dir))

    # --- the search ---------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> None:
        import optuna

        fixed, space = _split(arguments, self.params)
        if not space:
            raise ValueError("hparams_search: no search space; set hydra.sweeper.params "
                             "(e.g. optim.lr: tag(log, interval(1e-4, 1e-2))) in the preset")
        from scalelab.training.pruning import make_pruner

        pruner = make_pruner(self.pruner, self.pruner_startup_trials, self.pruner_warmup_steps)
        study = optuna.create_study(
            study_name=self.study_name, storage=_storage(self.storage), direction=self.direction,
            sampler=self._sampler(), pruner=pruner, load_if_exists=True)
        stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for t in stale:  # an interrupted search: its unfinished trials failed
            study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        left = self.n_trials - len(study.trials)
        print(f"[optuna] study {self.study_name!r} in {_shown(self.storage)}: "
              f"{len(study.trials)} trial(s) done, {max(left, 0)} to run, {self.n_jobs} at a time",
              flush=True)
        while left > 0:
            batch = [study.ask() for _ in range(min(self.n_jobs, left))]
            self._run(study, batch, fixed, space)
            left -= len(batch)
        self._report(study, fixed)

    def _run(self, study: Any, batch: list[Any], fixed: list[str],
             space: dict[str, Any]) -> None:
        import optuna

        from scalelab.training.pruning import PRUNED_AT

        jobs = []
        for trial in batch:
            chosen = [f"{key}={_suggest(trial, key, dist)}" for key, dist in space.items()]
            trial.set_user_attr("overrides", chosen)
            # the chosen values first: the job's name (config/run_name.py) starts with them
            jobs.append([*chosen, *fixed, f"optuna_trial={trial.number}"])
        self.validate_batch_is_legal(jobs)
        returns = self.launcher.launch(jobs, initial_job_idx=batch[0].number)
        # what the jobs wrote to the storage from their own processes (pruned_at_step)
        attrs = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
        for trial, ret in zip(batch, returns, strict=True):
            run_id = _run_id(ret.hydra_cfg)
            if run_id:  # the trial's MLflow run, for the parent's best-trial tags
                trial.set_user_attr("mlflow_run_id", run_id)
            try:
                value = ret.return_value  # re-raises the job's error
            except Exception as e:
                # a bad input is already one line (cli/job_failure.py); anything else: its type
                why = str(e) if isinstance(e, CompactHydraException) else f"{type(e).__name__}: {e}"
                print(f"[optuna] trial {trial.number} failed: {why}", flush=True)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if PRUNED_AT in attrs.get(trial.number, {}):
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                print(f"[optuna] trial {trial.number} pruned at step "
                      f"{attrs[trial.number][PRUNED_AT]}", flush=True)
            elif value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, float(value))
                print(f"[optuna] trial {trial.number}: {float(value):.4f}  "
                      f"{' '.join(trial.user_attrs['overrides'])}", flush=True)

    def _report(self, study: Any, fixed: list[str]) -> None:
        import optuna

        states = [t.state for t in study.trials]
        count = {s.name: states.count(s) for s in optuna.trial.TrialState if states.count(s)}
        print(f"[optuna] {len(states)} trials: " + ", ".join(f"{n} {k}" for k, n in count.items()),
              flush=True)
        try:
            best = study.best_trial
        except ValueError:
            print("[optuna] no trial completed: no best trial", flush=True)
            return
        args = [a for a in fixed if not a.startswith(("hparams_search=", "+hparams_search="))]
        chosen = list(best.user_attrs.get("overrides", []))  # the values the run trained with
        params = dict(o.split("=", 1) for o in chosen)
        command = shlex.join(["scalelab-train", *args, *chosen])
        out = self.sweep_dir / "best_trial.yaml"
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create({
            "study": self.study_name, "storage": _shown(self.storage), "trial": best.number,
            "value": best.value, "params": params, "command": command}), out)
        print(f"[optuna] best trial {best.number}: {best.value:.4f}  {' '.join(chosen)}", flush=True)
        print(f"[optuna] run it: {command}  (saved in {out})", flush=True)
        self._tag_parent(best, params)

    def _tag_parent(self, best: Any, params: dict[str, str]) -> None:
        """The best trial on the search's MLflow parent run: value, params, trial run id."""
        from scalelab.tracking.multirun import tag_parent
        from scalelab.tracking.store import resolve_tracking_uri

        logger = self.config.get("logger") or {}
        if logger.get("backend", "mlflow") != "mlflow":
            return
        tags = {"optuna.study": self.study_name, "optuna.best_trial": str(best.number),
                "optuna.best_value": f"{best.value:.6g}",
                **{f"optuna.best.{k}": v for k, v in params.items()}}
        if best.user_attrs.get("mlflow_run_id"):
            tags["optuna.best_run_id"] = str(best.user_attrs["mlflow_run_id"])
        try:
            uri = resolve_tracking_uri(logger.get("tracking_uri"), Path(str(self.config.paths.root)))
            parent = tag_parent(uri, self.sweep_dir, tags)
        except Exception as e:  # the result is printed and saved already; say why MLflow lacks it
            print(f"[optuna] best trial not tagged on the MLflow parent: {type(e).__name__}: {e}",
                  flush=True)
            return
        if parent:
            print(f"[optuna] tagged the MLflow parent run {parent}: optuna.best_*", flush=True)

    def _sampler(self) -> Any:
        import optuna

        samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
        if self.sampler not in samplers:
            raise ValueError(f"hydra.sweeper.sampler={self.sampler!r}: choose tpe or random")
        return samplers[self.sampler](seed=self.seed)


# --- the search space ------------------------------------------------------------------------
def _split(arguments: Sequence[str], params: dict[str, str]) -> tuple[list[str], dict[str, Any]]:
    """Command-line arguments -> (fixed overrides, {key: Hydra sweep}); the command line wins
    over the preset's ``params``."""
    parser = OverridesParser.create()
    space: dict[str, Any] = {}
    for key, value in params.items():
        space[key] = parser.parse_override(f"{key}={value}").value()
    fixed: list[str] = []
    for arg, override in zip(arguments, parser.parse_overrides(list(arguments)), strict=True):
        if override.is_sweep_override():
            space[override.get_key_element()] = override.value()
        else:
            fixed.append(arg)
            space.pop(_plain_key(override), None)
    return fixed, space


def _plain_key(override: Override) -> str:
    return override.get_key_element().lstrip("+~")


def _suggest(trial: Any, key: str, sweep: Any) -> str:
    """One value of ``sweep`` for ``trial``, as the override text the job gets."""
    if isinstance(sweep, ChoiceSweep):
        return str(trial.suggest_categorical(key, [str(v) for v in sweep.list]))
    if isinstance(sweep, RangeSweep):
        values = [str(v) for v in _range(sweep)]
        return str(trial.suggest_categorical(key, values))
    if isinstance(sweep, IntervalSweep):
        log_scale = "log" in sweep.tags
        lo, hi = sweep.start, sweep.end
        if isinstance(lo, int) and isinstance(hi, int):
            return str(trial.suggest_int(key, lo, hi, log=log_scale))
        return f"{trial.suggest_float(key, float(lo), float(hi), log=log_scale):.4g}"
    raise ValueError(f"hydra.sweeper.params.{key}: use interval(), tag(log, interval()), "
                     "range() or a choice (a,b,c)")


def _range(sweep: RangeSweep) -> list[Any]:
    out, v = [], sweep.start
    while (sweep.step > 0 and v < sweep.stop) or (sweep.step < 0 and v > sweep.stop):
        out.append(v)
        v += sweep.step
    return out


def _run_id(hydra_cfg: DictConfig | None) -> str | None:
    """The MLflow run id a trial's run folder (the job's output dir) records
    (cli/run_folder.py: mlflow_run_id); None if it has none (untracked, or refused early)."""
    from scalelab.cli.run_folder import RUN_ID_FILE

    folder = OmegaConf.select(hydra_cfg, "hydra.runtime.output_dir") if hydra_cfg else None
    path = Path(str(folder)) / RUN_ID_FILE
    return (path.read_text().strip() or None) if folder and path.is_file() else None


def _storage(url: str) -> str:
    """A SQLite file's folder is made first (Optuna would fail on a missing one)."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return url


def _shown(url: str) -> str:
    """The storage URL as printed and saved: without its password, if it holds one."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: Optuna will say so
        return url
