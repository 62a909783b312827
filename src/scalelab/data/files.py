"""Atomic file writes and file locks: a reader sees the old file or the whole new one.

Every file that other code reads back (summary.json, mlflow_run_id, exported weights, plans,
point configs, run tables, reports, checkpoints) goes through here: write a temp file IN THE
DESTINATION FOLDER (so the final rename never crosses filesystems), fsync it, rename it over the
target, fsync the folder. A failed write (a full disk) removes the temp file and leaves the old
target untouched. ``locked`` serialises processes (DDP ranks, parallel sweep jobs) on one
file. Imports only the standard library, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path_for(path: Path) -> Path:
    """The hidden temp name next to ``path`` (same folder, per process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def atomic_open(path: str | Path) -> Iterator[IO[bytes]]:
    """``with atomic_open(p) as f: f.write(...)``: ``p`` appears only once the block succeeded."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, **dumps_kwargs: Any) -> None:
    dumps_kwargs.setdefault("indent", 2)
    atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")


def atomic_save_with(path: str | Path, save: Callable[[Path], None]) -> None:
    """For writers that insist on a file name (matplotlib, pandas): ``save(tmp)`` then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")  # keeps the suffix
    try:
        save(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def locked(lock_path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing) for the block."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
