"""A run's one name: its folder, its MLflow run, ``summary.json``, the banner and the report.

``derive_run_name`` is the only place it is made: the experiment's ``run_name`` plus the short
form of the command-line overrides that change what is trained, e.g.
``pystdlib_small,n_layers=6,lr=3e-4``. An explicit ``run_name=...`` override is the name as it
is. Hydra's ``hydra.run.dir`` / ``hydra.sweep.subdir`` get it through the ``scalelab.run_label``
resolver, so folder and MLflow name cannot drift apart; a ``-m`` job's name carries its own
(swept) values. Pure string work: no Hydra, no IO.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

# Overrides that say where or how a run is recorded, not what it trains.
IGNORED_PREFIXES = (
    "hydra.", "hydra/", "paths.", "logger.", "logger=", "tags.", "+tags.", "resume=", "ckpt_path=",
    "run_name=", "experiment=", "+experiment=", "trainer.enable_progress_bar=",
    "callbacks.progress_bar.", "callbacks.sample.", "sweep_point=", "+sweep_point=",
    "debug=", "+debug=", "train.resume_schedule=", "hparams_search=", "+hparams_search=", "optuna_trial=",
)
MAX_LEN = 100
_UNSAFE = re.compile(r"[/\\\x00-\x1f]")  # what a folder name cannot hold


def short_override(override: str) -> str:
    """``model.n_layers=6`` -> ``n_layers=6``; ``data.path=/a/b.txt`` -> ``path=b.txt``."""
    key, _, value = override.lstrip("+~").partition("=")
    if "/" in value and not value.startswith("["):
        value = value.rstrip("/").rsplit("/", 1)[-1]  # a path: its last part tells runs apart
    return f"{key.rsplit('.', 1)[-1]}={value}" if value else key.rsplit(".", 1)[-1]


def meaningful_overrides(overrides: Iterable[str]) -> list[str]:
    return [o for o in overrides if not o.lstrip("~").startswith(IGNORED_PREFIXES)
            and not o.startswith(IGNORED_PREFIXES)]


def is_explicit(overrides: Iterable[str]) -> bool:
    """The command named the run itself (``run_name=...``)."""
    return any(o.lstrip("+").startswith("run_name=") for o in overrides)


def derive_run_name(base: str, overrides: Iterable[str]) -> str:
    """The run's name: ``base`` plus the overrides that matter (≤ MAX_LEN characters, no path
    separators); ``base`` alone when the overrides name the run (``run_name=``)."""
    overrides = [str(o) for o in overrides]
    if is_explicit(overrides):
        return str(base)
    name = ",".join([str(base), *(short_override(o) for o in meaningful_overrides(overrides))])
    name = _UNSAFE.sub("_", name)
    if len(name) > MAX_LEN:
        digest = hashlib.sha1(name.encode()).hexdigest()[:6]
        name = name[: MAX_LEN - 7] + "~" + digest  # not "..": never a path step
    return name


def run_label_resolver(base: str, overrides: Iterable[str] | None = None) -> str:
    """``${scalelab.run_label:${run_name},${hydra.overrides.task}}`` in conf/hydra/default.yaml."""
    return derive_run_name(str(base), [str(o) for o in overrides or []])
