"""The rule for a run's name, and how to write any value back into a Hydra override.

``run_name`` becomes a folder (``<log_dir>/<date>/<time>_<run_name>``) and an MLflow run name,
so it may not leave or hide its folder; every other character is kept (commas, spaces, quotes,
non-ASCII), and :func:`hydra_quoted` writes such a value so that a printed command runs as
printed.
"""

from __future__ import annotations

import re

MAX_RUN_NAME = 200  # with "<HH-MM-SS>_" and a "_N" suffix the folder name stays under 255 bytes


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a run folder (None: it can)."""
    if not name:
        return "run_name is empty: give the run a name"
    if len(name.encode()) > MAX_RUN_NAME:
        return (f"run_name is {len(name)} characters long: at most {MAX_RUN_NAME} (it names the "
                "run folder; a non-ASCII character counts as its UTF-8 bytes); give a shorter "
                "run_name")
    if "/" in name or name.startswith(".") or ".." in name:
        return (f"run_name={name!r}: a folder-safe name (no '/', no '..', not starting with a "
                "dot): the run folder must stay under paths.log_dir")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"run_name={name!r}: control characters (newline, tab, ...) are not allowed"
    return None


def check_run_name(name: str) -> str:
    """``name`` if it can name a run folder; else ValueError with the reason and the fix."""
    problem = run_name_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def folder_stem(name: str) -> str:
    """A folder-safe stand-in for ``name`` (for the multirun folder Hydra creates before any
    job checks the name; each job then refuses a bad name itself)."""
    if run_name_problem(name) is None:
        return name
    safe = re.sub(r"[\x00-\x1f\x7f/]|\.\.", "_", name).lstrip(".") or "run"
    return safe.encode()[:MAX_RUN_NAME].decode(errors="ignore")


def hydra_quoted(value: str) -> str:
    """``value`` as a single-quoted Hydra override value that parses back to exactly ``value``:
    commas, spaces, brackets and ``=`` lose their grammar meaning; backslashes before a quote or
    at the end, quotes and ``${`` are escaped (Hydra's rules for quoted values)."""
    def escape(m: re.Match[str]) -> str:
        return m.group(1) * 2 + ("\\" + m.group(2) if m.group(2) else "")

    return "'" + re.sub(r"(\\*)('|\$\{|$)", escape, value) + "'"
