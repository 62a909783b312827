"""Which folder a `scalelab-train` command runs in, decided while Hydra resolves ``hydra.run.dir``.

Hydra creates the run folder and writes ``.hydra/`` into it BEFORE the task starts, and it turns
any error raised while resolving ``hydra.run.dir`` into a garbled traceback. So:

- ``run_dir_resolver`` (behind ``${scalelab.run_dir:...}``) never raises: an unusable answer
  (``resume=true`` with no such run, a read-only or non-folder root) is kept as a deferred error,
  Hydra gets a scratch folder, and the task reports the error as one line (``raise_deferred``);
- ``hydra_subdir`` (behind ``hydra.output_subdir``) sends Hydra's config of a command that reuses
  an EXISTING folder (resume, ``ckpt_path=``) to ``.hydra.pending/``, so a command that fails
  validation never rewrites the ``.hydra/config.yaml`` of a run it was not allowed to touch
  (cli/run_folder.py's ``RunFolder`` commits or abandons it once the inputs are checked).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from scalelab.config.names import check_run_name

PENDING = ".hydra.pending"
_RUN_DIRS: dict[tuple, str] = {}  # one answer per process, however often Hydra re-resolves
_DEFERRED: dict[str, str] = {}  # scratch folder -> the error to report
_PREEXISTING: dict[str, bool] = {}  # run folder -> existed before this command


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() in ("true", "1", "yes")


def latest_run_dir(log_dir: Path, run_name: str, *, exact: bool = False) -> Path | None:
    """The newest ``<log_dir>/<date>/<time>_<run_name>[,<overrides>][_N]`` holding
    checkpoints/last.ckpt (a run's name is its experiment's plus its overrides: config/run_name.py)."""
    found = []
    for ckpt in log_dir.glob("*/*/checkpoints/last.ckpt"):
        folder = ckpt.parent.parent
        stem = folder.name.split("_", 1)[-1] if "_" in folder.name else ""
        if stem.rsplit("_", 1)[-1].isdigit() and stem.rsplit("_", 1)[0].startswith(run_name):
            stem = stem.rsplit("_", 1)[0]  # two runs started in the same second
        if stem == run_name or (not exact and stem.startswith(run_name + ",")):
            found.append((ckpt.stat().st_mtime, folder))
    return max(found)[1] if found else None


def _fresh_dir(log_dir: str, day: str, clock: str, run_name: str) -> Path:
    out = Path(log_dir) / day / f"{clock}_{run_name}"
    n = 1
    while out.exists():  # two runs started in the same second
        out = Path(log_dir) / day / f"{clock}_{run_name}_{n}"
        n += 1
    return out


def resolve_run_dir(output_dir: Any, resume: Any, log_dir: str, run_name: str, day: str,
                    clock: str, ckpt_path: Any = None, label: Any = None) -> str:
    """The run folder (see conf/hydra/default.yaml). Pure function of its arguments + disk.
    A new folder is named ``<time>_<label>`` (the run's one name; ``run_name`` without one)."""
    key = (output_dir, resume, log_dir, run_name, day, clock, ckpt_path, label)
    if key in _RUN_DIRS:
        return _RUN_DIRS[key]
    if output_dir:
        out = Path(str(output_dir)).expanduser().resolve()
    elif ckpt_path and Path(str(ckpt_path)).parent.name == "checkpoints":
        out = Path(str(ckpt_path)).expanduser().resolve().parent.parent  # continue that run
    elif _truthy(resume):
        # the run of this very name (same overrides), else the latest of the experiment (its
        # config is then compared with the command's: cli/resume_compare.py)
        latest = (latest_run_dir(Path(log_dir), str(label), exact=True) if label else None) \
            or latest_run_dir(Path(log_dir), run_name)
        if latest is None:
            raise ValueError(
                f"resume=true: no earlier run named {run_name!r} with checkpoints/last.ckpt under "
                f"{log_dir}; pass paths.output_dir=<run folder> (or ckpt_path=<file>), or "
                f"run_name=<the run's name>"
            )
        out = latest
    else:
        out = _fresh_dir(log_dir, day, clock, str(label or run_name))
    _RUN_DIRS[key] = str(out)
    return str(out)


def _unwritable(folder: Path, key: str) -> str | None:
    """Why ``folder`` cannot be created or written (None: it can)."""
    p = folder
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if p.exists() and not p.is_dir():
        return (f"{key}: {p} is a file, not a folder; set SCALELAB_ROOT (or {key}) to a "
                "writable folder")
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{key}: {p} is read-only; set SCALELAB_ROOT (or {key}) to a writable folder"
    return None


def run_dir_resolver(output_dir: Any, resume: Any, log_dir: str, run_name: str, day: str,
                     clock: str, ckpt_path: Any = None, label: Any = None) -> str:
    """``resolve_run_dir`` for Hydra: errors are deferred to the task (see module doc)."""
    try:
        check_run_name(str(run_name))
        out = resolve_run_dir(output_dir, resume, log_dir, run_name, day, clock, ckpt_path, label)
        key = "paths.output_dir" if output_dir else "paths.log_dir"
        problem = _unwritable(Path(out), key)
    except (ValueError, OSError) as e:
        out, problem = "", str(e)
    if problem:
        scratch = tempfile.mkdtemp(prefix="scalelab-unusable-run-dir-")
        _DEFERRED[scratch] = problem
        return scratch
    _PREEXISTING.setdefault(out, Path(out).exists())
    return out


def hydra_subdir(runtime_output_dir: Any) -> str:
    """Where Hydra saves its config: ``.hydra.pending`` for an existing folder (see module doc)."""
    return PENDING if _PREEXISTING.get(str(runtime_output_dir)) else ".hydra"


def created_by_this_command(out_dir: Path) -> bool:
    """The resolver saw ``out_dir`` missing (False when unknown: then it is never removed)."""
    return not _PREEXISTING.get(str(out_dir), True)


def raise_deferred(out_dir: Path) -> None:
    """The error the resolver deferred for this folder, if any, as a ValueError."""
    problem = _DEFERRED.get(str(out_dir))
    if problem:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise ValueError(problem)
