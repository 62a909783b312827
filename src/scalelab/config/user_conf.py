"""The YAML files of a user's config folder (``hydra.searchpath=[file://...]``), read once
before Hydra composes: Hydra reports a malformed file or a duplicated key as a 70-90 line
traceback; here it is one line naming the file, the line and the problem."""

from __future__ import annotations

import re
from pathlib import Path

_FILE_ENTRY = re.compile(r"file://([^,\]\s'\"]+)")


def searchpath_folders(overrides: list[str]) -> list[Path]:
    """The ``file://`` folders that ``hydra.searchpath=[...]`` overrides add."""
    folders: list[Path] = []
    for o in overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key == "hydra.searchpath":
            folders += [Path(m) for m in _FILE_ENTRY.findall(value)]
    return folders


def yaml_problem(path: Path) -> str | None:
    """Why ``path`` is not a YAML mapping Hydra can read (None: it is). Parsed with OmegaConf's
    own loader, the one Hydra uses, so a duplicated key counts as an error here too."""
    import yaml
    from omegaconf import OmegaConf

    try:
        OmegaConf.load(path)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}" if mark else ""
        return f"{path}{where}: {e.problem or e.context}"
    except (yaml.YAMLError, OSError, ValueError) as e:
        return f"{path}: {' '.join(str(e).split())}"
    return None


def check_user_config_folders(overrides: list[str]) -> None:
    """ValueError naming the first unreadable ``*.yaml`` of the searchpath folders."""
    for folder in searchpath_folders(overrides):
        if not folder.is_dir():
            raise ValueError(f"hydra.searchpath: {folder} is not a folder; give "
                             "hydra.searchpath=[file:///absolute/path/to/my_conf]")
        for path in sorted(folder.rglob("*.yaml")):
            problem = yaml_problem(path)
            if problem:
                raise ValueError(f"{problem} (a file of your config folder in hydra.searchpath; "
                                 "fix its YAML)")
