"""The run folder's life around one `scalelab-train` command: nothing is touched until the inputs
are checked, and a failed command leaves nothing behind.

Which folder, and where Hydra saves its config meanwhile, is decided in config/run_dir.py;
``RunFolder.commit()`` (inputs checked) promotes ``.hydra.pending/`` to ``.hydra/``;
``RunFolder.abandon()`` (the command failed before training) removes ``.hydra.pending/`` and,
if this command created the folder and nothing of value is in it, the folder itself.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scalelab.config.run_dir import PENDING, created_by_this_command, raise_deferred
from scalelab.data.files import LOCK_FILE, atomic_write_json, atomic_write_text, exclusive_folder

RUN_ID_FILE = "mlflow_run_id"  # <run folder>/mlflow_run_id: what resume reopens
SUMMARY_FILE = "summary.json"  # <run folder>/summary.json: final metrics, run id, status

# what Hydra itself puts in a folder: without anything else, a folder holds nothing of value
_HYDRA_ONLY = {".hydra", PENDING, "train.log", "__main__.log", LOCK_FILE}


class RunFolder:
    """Commit or abandon what Hydra and this command put into the run folder."""

    @staticmethod
    def check_usable(out_dir: Path) -> None:
        """The error the run-dir resolver deferred for ``out_dir`` (config/run_dir.py), if any."""
        raise_deferred(out_dir)

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.created_here = created_by_this_command(out_dir)
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

    @contextlib.contextmanager
    def abandoned_on_error(self, rank0: bool) -> Iterator[None]:
        """Abandon the folder (rank 0) if the block raises; the error goes on."""
        try:
            yield
        except BaseException:
            if rank0:
                self.abandon()
            raise

    def held(self, rank0: bool) -> contextlib.AbstractContextManager[None]:
        """One writer per run folder (rank 0 holds it for the run's life): a second command on
        the same folder (a second ``resume=true``) is refused, naming the holder's host and PID."""
        if not rank0:
            return contextlib.nullcontext()
        return exclusive_folder(self.out_dir, "run folder")

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

    # --- what a run leaves in its folder (rank 0 only) -------------------------------------
    @property
    def last_checkpoint(self) -> Path:
        return self.out_dir / "checkpoints" / "last.ckpt"

    def write_run_id(self, run_id: str | None) -> None:
        if run_id:
            atomic_write_text(self.out_dir / RUN_ID_FILE, run_id + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json: how the command ended; sweeps read it without MLflow."""
        atomic_write_json(self.out_dir / SUMMARY_FILE, summary)

    def write_failure(self, status: str, run_id: str | None, error: BaseException,
                      stop_fields: dict[str, Any] | None) -> None:
        with contextlib.suppress(OSError):  # a full disk must not hide the real error
            self.write_summary({"status": status, "run_id": run_id, "output_dir": str(self.out_dir),
                                "error": f"{type(error).__name__}: {error}", **(stop_fields or {})})
