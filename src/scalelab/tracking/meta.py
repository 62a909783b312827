"""Tags every run carries: code version, command line, host. Never fails (no git is fine)."""

from __future__ import annotations

import contextlib
import getpass
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import scalelab
from scalelab.paths import source_checkout
from scalelab.tracking.redact import redact


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def run_tags(root: Path) -> dict[str, str]:
    """git commit + dirty flag, the command line, scalelab version, host and user."""
    tags = {
        "scalelab.version": scalelab.__version__,
        "host": socket.gethostname(),
        "command": redact(shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])),
        "mlflow.source.name": Path(sys.argv[0]).name or "scalelab",
        "mlflow.source.type": "LOCAL",
    }
    with contextlib.suppress(Exception):  # no passwd entry in some containers
        tags["mlflow.user"] = getpass.getuser()
    # git facts come from the source tree the code runs from, never from the output root
    # (SCALELAB_ROOT may sit outside any repo); a wheel install has none, and records none.
    root = source_checkout() or root
    commit = _git(root, "rev-parse", "HEAD")
    if commit:
        tags["git.commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if status is not None:
        tags["git.dirty"] = str(bool(status)).lower()
    return tags
