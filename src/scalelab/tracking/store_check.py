"""A local SQLite store (``mlruns.db``) checked before any run is created, so a broken or
read-only file is one line naming it and the fix instead of a SQLAlchemy traceback.

Cheap on any size: the SQLite header (magic string, page size, page count) says whether the
file is a database and whether it was cut short; one read of the schema finds a garbled
first page. Deeper damage (a garbled table page) shows when MLflow opens the store
(``tracking.run.client_for``, called in the run's checks): :func:`damaged_store` turns SQLite's
"malformed" error there into the same one line, without reading the whole file at each start.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from scalelab.tracking.redact import redact

_MAGIC = b"SQLite format 3\x00"
_FIX = "move it aside (mv {p} {p}.broken) to start a fresh store, or point logger.tracking_uri elsewhere"


class StoreUnusable(ValueError):
    """The tracking store cannot be used as it is (the message names the file and the fix)."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def check_sqlite_store(uri: str) -> None:
    """Raise StoreUnusable if the SQLite file of ``uri`` is not a whole database or cannot be
    written; a store that does not exist yet is fine (MLflow creates it)."""
    path = sqlite_path(uri)
    if path is None or not path.exists():
        return
    where = f"logger.tracking_uri={redact(uri)}"
    fix = _FIX.format(p=path)
    if not path.is_file():
        raise StoreUnusable(f"{where}: {path} is not a file; {fix}")
    problem = _header_problem(path)
    if problem is None:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
                db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as e:
            problem = f"not a usable SQLite database ({e})"
    if problem:
        raise StoreUnusable(f"{where}: {path} is {problem}; {fix}")
    for target in (path, path.parent):  # SQLite writes a journal beside the file
        if not os.access(target, os.W_OK):
            raise StoreUnusable(f"{where}: {target} is read-only; make it writable, or point "
                                "logger.tracking_uri at a store you can write")


def _header_problem(path: Path) -> str | None:
    """Why the file's first 100 bytes (the SQLite header) do not describe it (None: they do)."""
    size = path.stat().st_size
    if size == 0:
        return None  # an empty file is an empty database to SQLite
    with path.open("rb") as f:
        head = f.read(100)
    if len(head) < 100 or not head.startswith(_MAGIC):
        return "not a SQLite database (its header is missing or overwritten)"
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    valid = int.from_bytes(head[24:28], "big") == int.from_bytes(head[92:96], "big")
    if valid and pages and size < pages * page_size:
        return f"truncated ({size:,} of {pages * page_size:,} bytes)"
    return None


def damaged_store(uri: str, error: BaseException) -> StoreUnusable | None:
    """The one-line error for ``error``, raised while MLflow opened the SQLite store of ``uri``,
    if SQLite said the file is damaged (None: another error, left as it is)."""
    path = sqlite_path(uri)
    cause = _sqlite_damage(error)
    if path is None or cause is None:
        return None
    return StoreUnusable(f"logger.tracking_uri={redact(uri)}: {path} is damaged (SQLite: "
                         f"{cause}); {_FIX.format(p=path)}")


def _sqlite_damage(error: BaseException | None) -> sqlite3.DatabaseError | None:
    """SQLite's own DatabaseError ("database disk image is malformed", "file is not a
    database") behind ``error``, through MLflow's and SQLAlchemy's wrappers. Its subclasses
    (OperationalError: locked, read-only; IntegrityError) are not damage."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error) is sqlite3.DatabaseError:
            return error
        orig = getattr(error, "orig", None)  # SQLAlchemy keeps the DBAPI error here
        if type(orig) is sqlite3.DatabaseError:
            return orig
        error = error.__cause__ or error.__context__
    return None
