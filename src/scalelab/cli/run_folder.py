"""The run folder's life around one `scalelab-train` command: nothing is touched until the inputs
are checked, and a failed command leaves nothing behind.

Hydra creates the run folder and writes ``.hydra/`` into it BEFORE the task starts, and it turns
any error raised while resolving ``hydra.run.dir`` into a garbled traceback. So:

- ``run_dir_resolver`` (behind ``${scalelab.run_dir:...}``) never raises: an unusable answer
  (``resume=true`` with no such run, a read-only or non-folder root) is kept as a deferred error,
  Hydra gets a scratch folder, and the task reports the error as one line (``raise_deferred``);
- ``hydra_subdir`` (behind ``hydra.output_subdir``) sends Hydra's config of a command that reuses
  an EXISTING folder (resume, ``ckpt_path=``) to ``.hydra.pending/``, so a command that fails
  validation never rewrites the ``.hydra/config.yaml`` of a run it was not allowed to touch;
- ``RunFolder.commit()`` (inputs checked) promotes ``.hydra.pending/`` to ``.hydra/``;
  ``RunFolder.abandon()`` (the command failed before training) removes ``.hydra.pending/`` and,
  if this command created the folder and nothing of value is in it, the folder itself.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

PENDING = ".hydra.pending"
_DEFERRED: dict[str, str] = {}  # scratch folder -> the error to report
_PREEXISTING: dict[str, bool] = {}  # run folder -> existed before this command
# what Hydra itself puts in a folder: without anything else, a folder holds nothing of value
_HYDRA_ONLY = {".hydra", PENDING, "train.log", "__main__.log"}


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
                     clock: str, ckpt_path: Any = None) -> str:
    """``resolve_run_dir`` for Hydra: errors are deferred to the task (see module doc)."""
    from scalelab.cli.schema import resolve_run_dir  # schema registers this resolver: no cycle

    try:
        out = resolve_run_dir(output_dir, resume, log_dir, run_name, day, clock, ckpt_path)
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


def raise_deferred(out_dir: Path) -> None:
    """The error the resolver deferred for this folder, if any, as a ValueError."""
    problem = _DEFERRED.get(str(out_dir))
    if problem:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise ValueError(problem)


class RunFolder:
    """Commit or abandon what Hydra and this command put into the run folder."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.created_here = not _PREEXISTING.get(str(out_dir), True)
        # Hydra's file handler appends to <folder>/train.log; for a folder this command may
        # not be allowed to touch, hold its records until the inputs are checked
        self._held: list[tuple[logging.Handler, logging.handlers.MemoryHandler]] = []
        if not self.created_here:
            self._hold_file_logs()

    def _hold_file_logs(self) -> None:
        root = logging.getLogger()
        for h in list(root.handlers):
            name = getattr(h, "baseFilename", None)
            if name and Path(name).resolve().parent == self.out_dir.resolve():
                buffer = logging.handlers.MemoryHandler(capacity=10**6, flushLevel=logging.CRITICAL + 1)
                buffer.setLevel(h.level)
                root.removeHandler(h)
                root.addHandler(buffer)
                self._held.append((h, buffer))

    def _release_file_logs(self, *, write: bool) -> None:
        root = logging.getLogger()
        for h, buffer in self._held:
            root.removeHandler(buffer)
            if write:
                buffer.setTarget(h)
                buffer.flush()
            buffer.buffer.clear()
            root.addHandler(h)
        self._held = []

    def commit(self) -> None:
        self._release_file_logs(write=True)
        pending = self.out_dir / PENDING
        if pending.is_dir():
            target = self.out_dir / ".hydra"
            shutil.rmtree(target, ignore_errors=True)  # checked: this command now owns the folder
            pending.rename(target)

    def abandon(self) -> None:
        self._release_file_logs(write=False)
        shutil.rmtree(self.out_dir / PENDING, ignore_errors=True)
        if not self.created_here or not self.out_dir.is_dir():
            return
        try:
            names = {p.name for p in self.out_dir.iterdir()}
        except OSError:
            return
        if names <= _HYDRA_ONLY:
            shutil.rmtree(self.out_dir, ignore_errors=True)
            with contextlib.suppress(OSError):  # the <date>/ folder, if this was its only run
                self.out_dir.parent.rmdir()
