"""Atomic file writes and file locks: a reader sees the old file or the whole new one.

Every file that other code reads back (summary.json, mlflow_run_id, exported weights, plans,
point configs, run tables, reports, checkpoints) goes through here: write a temp file IN THE
DESTINATION FOLDER (so the final rename never crosses filesystems), fsync it, rename it over the
target, fsync the folder. A failed write (a full disk) removes the temp file and leaves the old
target untouched. ``atomic_folder`` does the same for a folder of files (exports, reports).
``locked`` serialises processes (DDP ranks, parallel sweep jobs) on one file;
``exclusive_folder`` lets one process at a time write into a run or sweep folder. Imports only
the standard library, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
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


# --- one writer per folder ------------------------------------------------------------------
LOCK_FILE = ".scalelab.lock"  # <folder>/.scalelab.lock: the holder's host and PID, as JSON
_log = logging.getLogger("scalelab.files")


class FolderBusy(ValueError):
    """Another live process holds the folder's lock (a ValueError: bad input, exit 2)."""


def _holder(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process (its host and PID not written yet)"
    return f"PID {info['pid']} on host {info.get('host', '?')} (since {info.get('since', '?')})"


@contextlib.contextmanager
def exclusive_folder(folder: str | Path, what: str) -> Iterator[None]:
    """Hold an exclusive, non-blocking ``flock`` on ``<folder>/.scalelab.lock`` for the block.

    A second holder is refused at once with ``FolderBusy`` naming the first one's host and PID.
    The kernel drops the lock when its process dies, however it dies (SIGKILL, OOM), so a dead
    holder never blocks a resume. A filesystem without ``flock`` (some network mounts) logs one
    warning and the block runs unlocked.
    """
    import socket

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        locked_here = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderBusy(f"{what} {folder} is in use by {_holder(lock_path)}: one process "
                             "writes into it at a time; wait for that one to end (or stop it) "
                             "and rerun") from None
        except OSError as e:  # ENOLCK/EOPNOTSUPP: no locks on this filesystem
            _log.warning("could not lock %s (%s): nothing stops a second process writing into "
                         "it", folder, e.strerror)
            locked_here = False
        if locked_here:
            since = time.strftime("%Y-%m-%dT%H:%M:%S")
            info = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": since})
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode() + b"\n", 0)
        try:
            yield
        finally:
            if locked_here:  # empty while nobody holds it: a command that only checked and was
                os.ftruncate(fd, 0)  # refused leaves the folder's files as they were
    finally:
        os.close(fd)  # closing drops the lock


# --- whole folders ----------------------------------------------------------------------------
def check_replaceable(dest: Path, may_replace: Callable[[str], bool]) -> None:
    """Raise ValueError unless ``dest`` is absent, empty, or holds only names ``may_replace``
    accepts (what an earlier run of the same writer left): a whole-folder write never deletes
    a user's other files."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise ValueError(f"{dest}: exists and is a file; choose a new or empty folder")
    other = sorted(p.name for p in dest.iterdir() if not may_replace(p.name))
    if other:
        raise ValueError(f"{dest}: exists and holds {other[0]!r} ({len(other)} file(s) this "
                         "command does not write); choose a new or empty folder")


def _remove_dead_writers_leftovers(dest: Path) -> None:
    """Temp folders beside ``dest`` left by a writer that was killed (its PID is gone)."""
    for p in dest.parent.glob(f".{dest.name}.*.*"):
        pid = p.name[len(dest.name) + 2:].split(".")[0]
        if p.suffix not in (".tmp", ".old") or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            if int(pid) != os.getpid():
                continue  # a live writer's
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        if p.suffix == ".old" and not dest.exists():
            os.replace(p, dest)  # killed between its two renames: the old folder comes back
        else:
            shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(dest: str | Path,
                  may_replace: Callable[[str], bool] = lambda name: False) -> Iterator[Path]:
    """``with atomic_folder(d) as tmp: write files into tmp``: ``d`` then holds all of them.

    The files go into a hidden temp folder beside ``d`` (same filesystem); on success an old
    ``d`` is moved aside, the temp folder renamed to ``d`` and the old one removed, so a reader
    sees the old folder whole, the new one whole, or (for an instant) none; never a mix. A
    failed block removes the temp folder and leaves ``d`` as it was. An existing ``d`` is
    replaced only if empty or holding nothing but names ``may_replace`` accepts
    (``check_replaceable``, checked before and again at the swap).
    """
    dest = Path(dest).expanduser().resolve()
    _remove_dead_writers_leftovers(dest)
    check_replaceable(dest, may_replace)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    old = dest.with_name(f".{dest.name}.{os.getpid()}.old")
    tmp.mkdir(0o777)  # the umask applies, as for any folder the user makes
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb+") as fh:
                    os.fsync(fh.fileno())
        check_replaceable(dest, may_replace)  # nothing foreign arrived meanwhile
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not dest.exists():  # interrupted between the two renames
            os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)
    fsync_dir(dest.parent)
