"""The project root: where outputs/, data_cache/, mlruns.db and mlartifacts/ live.

Found from the package location (an editable install sits in ``<root>/src/scalelab``), never
from the current directory, so `scalelab-train` writes to the same places from any folder.
$SCALELAB_ROOT overrides it (e.g. a non-editable install, or tests with a scratch root).
"""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    env = os.environ.get("SCALELAB_ROOT")
    if env:
        return Path(env).expanduser().resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "conf").is_dir():
            return parent
    # Installed from a wheel: no repo around the package; fall back to the user's home.
    return (Path.home() / ".scalelab").resolve()


def conf_dir() -> Path:
    """Hydra's config folder: <root>/conf, or the one next to the source tree."""
    env_root = os.environ.get("SCALELAB_ROOT")
    if env_root and (Path(env_root) / "conf").is_dir():
        return (Path(env_root) / "conf").resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "conf" / "train.yaml").is_file():
            return parent / "conf"
    return repo_root() / "conf"
