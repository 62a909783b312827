"""Where scalelab reads its configs and writes its results (the ground floor: imports nothing
of scalelab, so every layer may use it).

- configs: the package's own ``scalelab/conf`` (shipped in the wheel; Hydra finds it as
  ``pkg://scalelab.conf``). A user's own config folder adds or overrides groups through
  ``hydra.searchpath=[file:///path/to/my_conf]``.
- results (outputs/, multirun/, data_cache/, mlruns.db, mlartifacts/): ``$SCALELAB_ROOT`` when
  set; else, in a source checkout (``<repo>/src/scalelab``), the repo root, whatever the current
  directory; else (an installed wheel) the current working directory — never the package
  location inside site-packages.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent  # .../scalelab


def source_checkout() -> Path | None:
    """The repo this package runs from (``<repo>/src/scalelab``), None for a wheel install."""
    if _PACKAGE.parent.name == "src" and (_PACKAGE.parent.parent / "pyproject.toml").is_file():
        return _PACKAGE.parent.parent
    return None


def repo_root() -> Path:
    env = os.environ.get("SCALELAB_ROOT")
    if env:
        return Path(env).expanduser().resolve()
    return source_checkout() or Path.cwd().resolve()


def conf_dir() -> Path:
    """Hydra's primary config folder: the package's ``conf/`` (the checkout's ``conf/`` in the
    layout before the configs moved into the package)."""
    packaged = _PACKAGE / "conf"
    if (packaged / "train.yaml").is_file():
        return packaged
    checkout = source_checkout()
    if checkout is not None and (checkout / "conf" / "train.yaml").is_file():
        return checkout / "conf"
    return packaged
